package ctl

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

var (
	remoteSessionCols = cols("ID", "id", "KIND", "kind", "TARGET", "target", "WHO", "user_name", "STARTED", "started_at",
		"ENDED", "ended_at", "TO DEVICE", "bytes_to_device", "FROM DEVICE", "bytes_from_device", "RECORDING", "recording_size", "WHY IT ENDED", "end_reason")
	remoteSettingsCols = cols("RECORDING", "recording")
)

// sessionsCmd is the remote sessions of a device or the tenant
// (docs/api.md, Remote sessions): what ssh, forward and cp opened, ending one, and a shell's
// recording.
func (a *app) sessionsCmd() *cobra.Command {
	var p page
	var w listWatch
	var open bool
	list := &cobra.Command{
		Use:               "list [DEVICE]",
		Aliases:           []string{"ls"},
		Short:             "A device's remote sessions, or the tenant's, newest first: who, what, when, bytes each way, why each ended",
		Args:              rangeArgs(0, 1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			q := p.query(nil)
			if open {
				q.Set("open", "true")
			}
			if len(args) == 0 {
				return a.list(cmd, "/api/v1/remote-sessions", q,
					view{items: "remote_sessions", cols: append(cols("DEVICE", "device_id"), remoteSessionCols...)}, w)
			}
			return a.list(cmd, "/api/v1/devices/"+esc(args[0])+"/remote-sessions", q,
				view{items: "remote_sessions", cols: remoteSessionCols}, w)
		},
	}
	list.Flags().BoolVar(&open, "open", false, "only the sessions not ended")
	p.flags(list)
	w.flags(list)
	end := &cobra.Command{
		Use:   "end DEVICE SESSION",
		Short: "End an open remote session, whichever replica relays it; its operator is told who ended it",
		Args:  exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.show(cmd, request{method: "POST", path: "/api/v1/devices/" + esc(args[0]) + "/remote-sessions/" + esc(args[1]) + "/end"},
				view{cols: remoteSessionCols})
		},
	}
	var out string
	recording := &cobra.Command{
		Use:   "recording DEVICE SESSION [--out FILE]",
		Short: "Download a recorded shell session's output, an asciicast v2 file (asciinema play FILE)",
		Long: `Downloads the recording of a shell session of a tenant that records them
('fleetctl tenant remote set --recording'), once the session has ended.`,
		Example: "  fleetctl sessions recording pump-1 0b6f…\n  fleetctl sessions recording pump-1 0b6f… --out - | asciinema play -",
		Args:    exactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			resp, err := c.send(cmd.Context(), request{method: "GET", accept: "application/x-asciicast",
				path: "/api/v1/devices/" + esc(args[0]) + "/remote-sessions/" + esc(args[1]) + "/recording"})
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if out == "-" {
				_, err = io.Copy(a.env.Stdout, resp.Body)
				return err
			}
			name := out
			if name == "" {
				name = args[1] + ".cast"
			}
			f, err := os.Create(name)
			if err != nil {
				return err
			}
			n, err := io.Copy(f, resp.Body)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			fmt.Fprintf(a.env.Stderr, "%s: %d bytes\n", name, n)
			return nil
		},
	}
	recording.Flags().StringVar(&out, "out", "", "`FILE` to write, - for standard output (default: SESSION.cast)")
	return group("sessions", "Remote sessions with a device: list them, end one, download a shell's recording", list, end, recording)
}

// tenantRemoteCmd is the tenant's remote-session settings.
func (a *app) tenantRemoteCmd() *cobra.Command {
	get := &cobra.Command{
		Use:   "get",
		Short: "Show the tenant's remote-session settings",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := a.tenantPath("remote-settings")
			if err != nil {
				return err
			}
			return a.get(cmd, p, nil, view{cols: remoteSettingsCols})
		},
	}
	var record bool
	set := &cobra.Command{
		Use:     "set --recording=true|false",
		Short:   "Change the tenant's remote-session settings: --recording records the output of shell sessions opened from now on",
		Example: "  fleetctl tenant remote set --recording\n  fleetctl tenant remote set --recording=false",
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("recording") {
				return usagef("tenant remote set needs --recording")
			}
			p, err := a.tenantPath("remote-settings")
			if err != nil {
				return err
			}
			return a.show(cmd, request{method: "PUT", path: p, body: map[string]bool{"recording": record}}, view{cols: remoteSettingsCols})
		},
	}
	set.Flags().BoolVar(&record, "recording", false, "record shell sessions' output (asciicast v2) into the blob store (docs/agent.md)")
	return group("remote", "The tenant's remote-session settings: recording shell sessions", get, set)
}
