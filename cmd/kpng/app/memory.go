package app

import (
	"runtime/debug"
	"sync/atomic"

	"sigs.k8s.io/kpng/localsink"
)

// releaseAfterFullState returns observe (nil: none) followed, after each
// round that delivered the whole state (Reset) and was applied, by
// debug.FreeOSMemory in a goroutine of its own (one at a time). A full
// state is the process's peak: at 10,000 services × 10 endpoints, the
// nftables backend's first transaction takes the live heap from about
// 140 MiB to 215 MiB for a moment, the garbage collector lets the heap
// grow to twice the live heap (GOGC=100), and the runtime gives the pages
// back to the OS only slowly: without this the process held about
// 500 MiB RSS long after it needed 150 (docs/benchmarks.md, "Memory of
// the whole proxier").
func releaseAfterFullState(observe func(localsink.Round)) func(localsink.Round) {
	var running atomic.Bool
	return func(r localsink.Round) {
		if observe != nil {
			observe(r)
		}
		if !r.Reset || r.Err != nil || !running.CompareAndSwap(false, true) {
			return
		}
		go func() {
			defer running.Store(false)
			debug.FreeOSMemory()
		}()
	}
}
