//go:build !unix

package callout

import "os/exec"

// inNewProcessGroup does nothing where process groups are not supported.
func inNewProcessGroup(*exec.Cmd) {}

// killProcessGroup kills the callout's process only, where process groups
// are not supported.
func killProcessGroup(cmd *exec.Cmd) error { return cmd.Process.Kill() }
