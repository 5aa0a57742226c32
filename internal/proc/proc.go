// Package proc answers questions about other processes for kpng's tests
// and test harnesses.
package proc
