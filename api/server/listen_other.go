//go:build !unix

package server

import (
	"fmt"
	"net"
)

func listenUnix(path string) (net.Listener, error) {
	return nil, fmt.Errorf("listen unix:%s: unix sockets with private permissions need a unix system; use TCP with TLS", path)
}
