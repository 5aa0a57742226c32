package callout

import (
	"strings"
	"testing"
)

// FuzzSplit: any $CALLOUT is split without a panic; words quoted back
// with single quotes split to the same words.
func FuzzSplit(f *testing.F) {
	for _, s := range []string{`jq .`, `sh -c 'echo "$1"' x`, `a"b"'c'\ d`, `''`, `a | b`, `"unterminated`, "a\\", "\n\nx\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words, err := Split(s)
		if err != nil {
			return
		}
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = "'" + strings.ReplaceAll(w, "'", `'"'"'`) + "'"
		}
		again, err := Split(strings.Join(quoted, " "))
		if err != nil || strings.Join(again, "\x00") != strings.Join(words, "\x00") || len(again) != len(words) {
			t.Fatalf("Split(%q) = %q; quoted back and split: %q, %v", s, words, again, err)
		}
	})
}
