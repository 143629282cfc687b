package ctl

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/firmware/bundle"
	"github.com/google/uuid"
	"github.com/spf13/cobra"
)

var (
	bundleCols = cols("ID", "id", "VERSION", "version", "FILE", "file_name", "STATUS", "upload_status", "ERROR", "upload_error",
		"BYTES", "content_length", "CHECKSUM", "checksum", "CREATED", "created_at")
	firmwareCols = cols("COMPONENT", "component_name", "VERSION", "version_number", "FILE", "file_name", "BYTES", "content_length",
		"UNCOMPRESSED", "uncompressed_size", "DEACTIVATED", "is_deactivated", "DEPENDENCIES", "dependencies")
	bundleView     = view{cols: bundleCols, more: &view{items: "firmwares", cols: firmwareCols}}
	bundleListView = view{items: "firmware_bundles", cols: bundleCols}
	firmwareList   = view{items: "firmwares", cols: firmwareCols}
)

// bundleRef is what the firmware commands need of a bundle.
type bundleRef struct {
	ID            string  `json:"id"`
	Version       string  `json:"version"`
	FileName      string  `json:"file_name"`
	UploadStatus  string  `json:"upload_status"`
	ContentLength *int64  `json:"content_length"`
	Checksum      *string `json:"checksum"`
}

// bundlePath is the path of a bundle given by id (a UUID) or version.
func bundlePath(ref string) string {
	if _, err := uuid.Parse(ref); err == nil {
		return "/api/v1/firmware-bundles/id/" + esc(ref)
	}
	return "/api/v1/firmware-bundles/version/" + esc(ref)
}

func (a *app) bundle(cmd *cobra.Command, ref string) (*client, bundleRef, error) {
	var b bundleRef
	c, err := a.connect(cmd.Context())
	if err != nil {
		return nil, b, err
	}
	return c, b, c.getJSON(cmd.Context(), bundlePath(ref), nil, &b)
}

func (a *app) firmwareCmd() *cobra.Command {
	var version, out string
	deps := bundle.Depends{}
	create := &cobra.Command{
		Use:     "create --version VERSION --out FILE NAME=VERSION:PATH...",
		Short:   "Build a bundle archive with its manifest from component files (as fleetd bundle create)",
		Long:    bundle.BuildHelp("fleetctl firmware bundle create"),
		Args:    rangeArgs(1, 1000),
		Aliases: []string{"build"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if version == "" || out == "" {
				return usagef("bundle create needs --version and --out")
			}
			parsed, err := bundle.BuildFile(out, version, args, deps)
			if err != nil {
				return err
			}
			bundle.WriteBuildReport(a.env.Stdout, out, parsed)
			return nil
		},
	}
	create.Flags().StringVar(&version, "version", "", "the bundle's `VERSION` (numbers separated by dots; required)")
	create.Flags().StringVar(&out, "out", "", "`FILE` to write the archive to (.tar.gz, or .tar for no gzip; required)")
	create.Flags().Var(deps, "depends", "a dependency of a component; repeatable")

	var verified bool
	upload := &cobra.Command{
		Use:   "upload FILE",
		Short: "Upload a bundle archive, streamed, with a progress bar",
		Long: `Uploads a bundle archive in one streamed request; the server parses it and
the bundle is completed at once. With --verified the archive is first
read here as the server will read it, then uploaded in three steps: a
pending record, the file, and the S5 declaration of its sizes and
checksum, which the server compares with what it received (a difference
fails the bundle, and fleetctl exits 1).

The same archive again, byte for byte, is not an error: the server
answers with the bundle it has (a re-run CI job passes). Another archive
of a version that exists is refused (409, exit 1).`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.upload(cmd, args[0], verified)
		},
	}
	upload.Flags().BoolVar(&verified, "verified", false, "declare the archive's sizes and checksum for the server to compare (three requests)")

	var status string
	list := a.listCmd("List firmware bundles, newest first", "/api/v1/firmware-bundles", bundleListView, func(q url.Values) error {
		setIf(q, "upload_status", status)
		return nil
	})
	list.Flags().StringVar(&status, "status", "", "only bundles in this upload state: pending, completed or failed")

	get := &cobra.Command{
		Use:               "get VERSION|ID",
		Short:             "Show a bundle, by version (S6) or id, with its components",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeBundles,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, bundlePath(args[0]), nil, bundleView)
		},
	}

	var dlOut string
	download := &cobra.Command{
		Use:   "download VERSION|ID [--out FILE]",
		Short: "Download a bundle's archive, resuming a partial file, and check its checksum",
		Long: `Downloads a completed bundle's archive to --out (default: its file name, here).
A shorter file already there is resumed with a Range request (If-Range on
the archive's checksum, so a changed archive is fetched whole). The file is
checked against the bundle's SHA-256 at the end; a resumed file that does
not match is downloaded again whole, once. A redirect to a presigned URL of
the server's bucket is followed without the API key.`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeBundles,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.download(cmd, args[0], dlOut)
		},
	}
	download.Flags().StringVar(&dlOut, "out", "", "`FILE` to write (default: the bundle's file name)")

	del := &cobra.Command{
		Use:               "delete VERSION|ID",
		Short:             "Delete a bundle and its archive; its component versions stay",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeBundles,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, b, err := a.bundle(cmd, args[0])
			if err != nil {
				return err
			}
			if err := a.do(cmd, "DELETE", "/api/v1/firmware-bundles/id/"+esc(b.ID), nil); err != nil {
				return err
			}
			fmt.Fprintf(a.env.Stdout, "deleted bundle %s (%s)\n", b.Version, b.ID)
			return nil
		},
	}

	var cp page
	components := &cobra.Command{
		Use:   "components NAME",
		Short: "List a component's versions, newest first",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/firmwares/component/"+esc(args[0]), cp.query(nil), firmwareList)
		},
	}
	cp.flags(components)

	s8 := func(use, short string, deactivate bool) *cobra.Command {
		return &cobra.Command{
			Use:   use + " NAME VERSION",
			Short: short,
			Args:  exactArgs(2),
			RunE: func(cmd *cobra.Command, args []string) error {
				return a.show(cmd, request{method: "PUT", path: "/api/v1/firmwares/component/" + esc(args[0]) + "/" + esc(args[1]),
					body: map[string]any{"is_deactivated": deactivate}}, view{cols: firmwareCols})
			},
		}
	}

	return group("firmware", "Build, upload, list, download and (de)activate firmware",
		group("bundle", "Build bundle archives", create),
		upload, list, get, download, del, components,
		s8("activate", "Allow a component version to be dispatched again (S8)", false),
		s8("deactivate", "Stop new dispatches of every bundle that holds a component version (S8)", true))
}

// upload streams the archive as multipart/form-data, part file, or
// verified in three steps.
func (a *app) upload(cmd *cobra.Command, path string, verified bool) error {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	f, size, err := openRegular(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if verified {
		return a.uploadVerified(cmd, c, f, size)
	}
	p := a.newProgress(filepath.Base(path), size, 0)
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		part, err := mw.CreateFormFile("file", filepath.Base(path))
		if err == nil {
			_, err = io.Copy(part, p.reader(f))
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	accept := ""
	if a.output == "edn" {
		accept = "application/edn"
	}
	body, err := c.call(cmd.Context(), request{method: "POST", path: "/api/v1/firmware-bundles", raw: pr,
		contentType: mw.FormDataContentType(), length: -1, accept: accept})
	pr.CloseWithError(errors.New("request ended"))
	if err != nil {
		return err
	}
	p.finish("uploaded")
	return a.print(body, bundleView)
}

// uploadVerified reads the archive as the server will, then makes a
// pending record, uploads the file and declares what it read (S5).
func (a *app) uploadVerified(cmd *cobra.Command, c *client, f *os.File, size int64) error {
	path := f.Name()
	parsed, err := bundle.Parse(f, bundle.ParseOptions{})
	if err != nil {
		return fmt.Errorf("%s is not a bundle the server would take: %s", path, fleet.ErrorMessage(err))
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	ctx := cmd.Context()
	var b bundleRef
	created, err := c.call(ctx, request{method: "POST", path: "/api/v1/firmware-bundles",
		body: map[string]any{"version": parsed.Manifest.Version, "file_name": filepath.Base(path)}})
	var ae *apiError
	if errors.As(err, &ae) && ae.Status == http.StatusConflict {
		// The version is taken: if by a completed bundle, send the file
		// to it, which the server takes when it is the same archive (a
		// re-run job) and refuses otherwise.
		if gerr := c.getJSON(ctx, bundlePath(parsed.Manifest.Version), nil, &b); gerr != nil || b.UploadStatus != fleet.UploadCompleted {
			return err
		}
	} else if err != nil {
		return err
	} else if err := json.Unmarshal(created, &b); err != nil {
		return err
	}
	p := a.newProgress(filepath.Base(path), size, 0)
	if _, err := c.call(ctx, request{method: "PUT", path: "/api/v1/firmware-bundles/id/" + esc(b.ID) + "/file",
		raw: p.reader(f), length: size, contentType: "application/octet-stream"}); err != nil {
		return err
	}
	p.finish("uploaded")
	decl := fleet.Declaration{UncompressedSize: parsed.UncompressedSize, Checksum: parsed.Checksum, ContentLength: parsed.ContentLength}
	if _, err := c.call(ctx, request{method: "PUT", path: "/api/v1/firmware-bundles/id/" + esc(b.ID), body: decl}); err != nil {
		return err
	}
	return a.get(cmd, "/api/v1/firmware-bundles/id/"+esc(b.ID), nil, bundleView)
}

func openRegular(path string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, usagef("%v", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", path)
	}
	if err != nil {
		f.Close()
		return nil, 0, usagef("%v", err)
	}
	return f, fi.Size(), nil
}

// download fetches the archive into out, resuming what is there.
func (a *app) download(cmd *cobra.Command, ref, out string) error {
	c, b, err := a.bundle(cmd, ref)
	if err != nil {
		return err
	}
	if b.UploadStatus != fleet.UploadCompleted || b.Checksum == nil || b.ContentLength == nil {
		return fmt.Errorf("bundle %s is %s: only a completed bundle has an archive to download", b.Version, b.UploadStatus)
	}
	if out == "" {
		out = filepath.Base(b.FileName)
	}
	f, err := os.OpenFile(out, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return usagef("%v", err)
	}
	defer f.Close()
	for attempt := 0; ; attempt++ {
		resumed, err := a.fetchArchive(cmd, c, b, f, attempt == 0)
		if err != nil {
			return err
		}
		sum, err := fileSHA256(f)
		if err != nil {
			return err
		}
		if sum == *b.Checksum {
			fmt.Fprintf(a.env.Stdout, "%s: bundle %s, %d bytes, sha256 %s verified\n", out, b.Version, *b.ContentLength, sum)
			return nil
		}
		if !resumed || attempt > 0 {
			return fmt.Errorf("%s: sha256 %s, but the bundle's is %s: the download is corrupt", out, sum, *b.Checksum)
		}
		fmt.Fprintf(a.env.Stderr, "%s: the resumed file does not match the bundle's checksum; downloading it whole\n", out)
	}
}

// fetchArchive writes the archive into f: from where f ends when resume
// is set and f is shorter than the archive, else whole. It reports
// whether it resumed.
func (a *app) fetchArchive(cmd *cobra.Command, c *client, b bundleRef, f *os.File, resume bool) (bool, error) {
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, err
	}
	if !resume || have > *b.ContentLength {
		have = 0
	}
	if have == *b.ContentLength {
		return true, nil // all there: the checksum says whether it is right
	}
	h := http.Header{}
	if have > 0 {
		h.Set("Range", fmt.Sprintf("bytes=%d-", have))
		h.Set("If-Range", `"`+*b.Checksum+`"`)
	}
	resp, err := c.send(cmd.Context(), request{method: "GET", path: "/api/v1/firmware-bundles/id/" + esc(b.ID) + "/artifact",
		accept: "application/octet-stream", header: h})
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusPartialContent {
		have = 0 // the whole archive came
	}
	if err := f.Truncate(have); err != nil {
		return false, err
	}
	if _, err := f.Seek(have, io.SeekStart); err != nil {
		return false, err
	}
	p := a.newProgress(filepath.Base(f.Name()), *b.ContentLength, have)
	if _, err := io.Copy(f, p.reader(resp.Body)); err != nil {
		return false, fmt.Errorf("download of %s broke off at %d bytes (run the same command to resume): %w", b.Version, p.done, err)
	}
	if have > 0 {
		p.finish(fmt.Sprintf("resumed at %d bytes, downloaded", have))
	} else {
		p.finish("downloaded")
	}
	return have > 0, nil
}

func fileSHA256(f *os.File) (string, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// completeBundles completes bundle versions from the server.
func (a *app) completeBundles(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var list struct {
		Bundles []bundleRef `json:"firmware_bundles"`
	}
	if !a.complete(cmd, "/api/v1/firmware-bundles", url.Values{"limit": {"100"}}, &list) {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var out []string
	for _, b := range list.Bundles {
		out = append(out, b.Version+"\t"+b.UploadStatus)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
