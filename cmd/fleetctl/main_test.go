//go:build linux

package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/creack/pty"
	"github.com/fleetd/fleet/ctl"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestLoginPromptsWithoutEcho runs fleetctl login as a person does, on a
// terminal (a pty) with neither --api-key nor FLEETCTL_API_KEY: it asks
// for the key, turns the terminal's echo off before the key is typed, so
// the key never shows on the screen, and logs in with what was typed.
func TestLoginPromptsWithoutEcho(t *testing.T) {
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0])
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	t.Setenv("FLEETCTL_API_KEY", "")
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	var screen fleetdtest.LockedBuffer // what the terminal shows
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := ptmx.Read(b)
			screen.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()

	done := make(chan int, 1)
	go func() {
		done <- ctlRun(environment(tty, tty, tty), "login", "--url", s.URL, "--tenant", "default")
	}()
	fleetdtest.Eventually(t, "the prompt, and the terminal's echo off", func() bool {
		return strings.Contains(screen.String(), "API key for tenant default: ") && !echoes(t, tty)
	})
	if _, err := ptmx.Write([]byte(s.Key + "\r")); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != 0 {
		t.Fatalf("login exited %d; the terminal showed:\n%s", code, screen.String())
	}
	fleetdtest.Eventually(t, "the terminal's echo back on", func() bool { return echoes(t, tty) })
	if strings.Contains(screen.String(), s.Key) {
		t.Fatalf("the key was shown on the terminal:\n%s", screen.String())
	}
	// The context stored works without the key given again.
	if code := ctlRun(environment(tty, tty, tty), "devices", "list"); code != 0 {
		t.Fatalf("devices list after login exited %d:\n%s", code, screen.String())
	}
}

func ctlRun(env ctl.Env, args ...string) int { return ctl.Run(context.Background(), args, env) }

// echoes reports whether the terminal tty echoes what is typed.
func echoes(t *testing.T, tty interface{ Fd() uintptr }) bool {
	t.Helper()
	var tios syscall.Termios
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, tty.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&tios))); errno != 0 {
		t.Fatalf("TCGETS: %v", errno)
	}
	return tios.Lflag&syscall.ECHO != 0
}
