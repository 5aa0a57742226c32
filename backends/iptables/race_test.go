//go:build linux && race

package iptables

// raceEnabled is true when the tests run with the race detector: the
// tests that start processes of the test binary make fewer of them.
const raceEnabled = true
