package statefile

import (
	"os"
	"syscall"
)

// changeTime returns the change time (ctime) of the file fi describes, in
// nanoseconds: no call sets it, every change of the file's content or
// metadata moves it.
func changeTime(fi os.FileInfo) int64 {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	return st.Ctim.Nano()
}
