//go:build !linux && !windows

package userspace

import (
	"fmt"
	"runtime"

	"k8s.io/klog/v2"
)

// newPlatform fails: the proxier holds its addresses on Linux and
// Windows only.
func newPlatform(klog.Logger, Config, Options) (platform, error) {
	return nil, fmt.Errorf("the userspace backend runs on Linux and Windows, not %s", runtime.GOOS)
}

// cleanup fails as newPlatform does.
func cleanup(logger klog.Logger, cfg Config, opts Options) error {
	_, err := newPlatform(logger, cfg, opts)
	return err
}
