// Package loopback starts the servers tests run as programs of their own
// (Mosquitto, VersityGW) on loopback ports. Neither can be handed a
// listening socket, nor binds port 0 and says which port it got, so a port
// is found free and the server told to bind it; another process may take
// the port in between. Start sees that the server could not bind, and
// starts it again on other ports.
package loopback

import (
	"errors"
	"net"
	"testing"
)

// ErrPortTaken is what a start function returns, wrapped, when its server
// could not bind a port it was given because another process holds it.
var ErrPortTaken = errors.New("port taken")

// attempts is how many sets of ports Start tries: a port is taken between
// its choice and its bind only when the machine is busy with ports, and
// ten times in a row not at all.
const attempts = 10

// Start calls start with n distinct loopback ports that were free a moment
// before, again with others while it returns ErrPortTaken, and fails the
// test on any other error or when every attempt found a port taken.
func Start(t testing.TB, n int, start func(ports []int) error) {
	t.Helper()
	var err error
	for range attempts {
		if err = start(Ports(t, n)); !errors.Is(err, ErrPortTaken) {
			break
		}
		t.Logf("loopback: %v; trying other ports", err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Ports returns n distinct loopback ports that are free now. They may not
// be by the time a server binds them: start servers through Start.
func Ports(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// Held until all are chosen, so that they differ.
		defer ln.Close()
		ports[i] = ln.Addr().(*net.TCPAddr).Port
	}
	return ports
}
