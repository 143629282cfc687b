//go:build !linux

package broker

import "errors"

// poller parks connections on Linux only (epoll); elsewhere every
// connection keeps its goroutine.
type poller struct{}

func newPoller() (*poller, error) {
	return nil, errors.New("parking idle connections needs epoll (Linux)")
}

func (p *poller) watch(d *device, fd int, deadline int64) error { return errors.ErrUnsupported }
func (p *poller) forget(d *device)                              {}
func (p *poller) count() int                                    { return 0 }
func (p *poller) close()                                        {}

// Connections never park here, so no socket is ever held apart.
func (d *device) detachLocked() error                { return errors.ErrUnsupported }
func (d *device) attachLocked()                      {}
func (d *device) closeApartLocked(disconnect []byte) {}
