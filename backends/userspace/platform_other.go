//go:build !linux && !windows

package userspace

import (
	"fmt"
	"runtime"
)

// newPlatform fails: the proxier holds its addresses on Linux and
// Windows only.
func newPlatform(Config, Options) (platform, error) {
	return nil, fmt.Errorf("the userspace backend runs on Linux and Windows, not %s", runtime.GOOS)
}

// cleanup fails as newPlatform does.
func cleanup(cfg Config, opts Options) error {
	_, err := newPlatform(cfg, opts)
	return err
}
