package callout

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// splitCases are valid command lines and their words.
var splitCases = []struct {
	in   string
	want []string
}{
	{``, nil},
	{"  \t\n ", nil},
	{`jq`, []string{"jq"}},
	{`  jq   -c  . `, []string{"jq", "-c", "."}},
	{"a\tb \t c", []string{"a", "b", "c"}},
	{"\n jq -c . \n\n", []string{"jq", "-c", "."}},
	{"a 'b\nc' \"d\ne\"", []string{"a", "b\nc", "d\ne"}},
	// single quotes: everything literal, backslash included
	{`jq -r '.Service.IPs.ExternalIPs.V6[0]'`, []string{"jq", "-r", ".Service.IPs.ExternalIPs.V6[0]"}},
	{`jq -r '.Endpoints[]|select(.Local == true)|.IPs.V6[0]'`, []string{"jq", "-r", ".Endpoints[]|select(.Local == true)|.IPs.V6[0]"}},
	{`echo 'a\nb' '"x"'`, []string{"echo", `a\nb`, `"x"`}},
	// double quotes: \" \\ \$ \` and backslash-newline are escapes, other backslashes stay
	{`echo "a b" "c\"d" "e\\f" "g\$h" "i\` + "`" + `j"`, []string{"echo", "a b", `c"d`, `e\f`, "g$h", "i`j"}},
	{`echo "a\nb" "x\'y"`, []string{"echo", `a\nb`, `x\'y`}},
	{"echo \"a\\\nb\"", []string{"echo", "ab"}},
	{`echo "it's"`, []string{"echo", "it's"}},
	// backslash outside quotes
	{`echo a\ b \'x\' \"y\" \\`, []string{"echo", "a b", "'x'", `"y"`, `\`}},
	{`echo \|`, []string{"echo", "|"}},
	{"echo a\\\nb", []string{"echo", "ab"}},
	{"echo a \\\n b", []string{"echo", "a", "b"}},
	// adjacent quoted and unquoted parts form one word
	{`"a"'b'c`, []string{"abc"}},
	{`--arg="x y"`, []string{"--arg=x y"}},
	// empty arguments
	{`prog '' ""`, []string{"prog", "", ""}},
	{`prog ''x`, []string{"prog", "x"}},
	// no expansion of any kind
	{`echo $HOME ${X} ~ * ?.go #c`, []string{"echo", "$HOME", "${X}", "~", "*", "?.go", "#c"}},
	{`echo "$HOME"`, []string{"echo", "$HOME"}},
	// quoted operators are plain text
	{`sh -c 'jq . | tee /tmp/x; true'`, []string{"sh", "-c", "jq . | tee /tmp/x; true"}},
	{`echo "a>b" 'c&d'`, []string{"echo", "a>b", "c&d"}},
	// non-ASCII passes through
	{`echo 'héllo wörld' ünï`, []string{"echo", "héllo wörld", "ünï"}},
}

func TestSplit(t *testing.T) {
	for _, tc := range splitCases {
		got, err := Split(tc.in)
		if err != nil {
			t.Errorf("Split(%q): %v", tc.in, err)
			continue
		}
		if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Errorf("Split(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSplitErrors(t *testing.T) {
	for _, tc := range []struct {
		in     string
		offset int
		msg    string
	}{
		{`jq '.x`, 3, "unterminated single quote"},
		{`jq ".x`, 3, "unterminated double quote"},
		{`jq ".x\"`, 3, "unterminated double quote"},
		{`a 'b' "c`, 6, "unterminated double quote"},
		{`jq "it's`, 3, "unterminated double quote"},
		{`jq 'say "hi"`, 3, "unterminated single quote"},
		{`jq \`, 3, "trailing backslash"},
		{`jq . | tee x`, 5, `unquoted '|' needs a shell`},
		{`jq . > out`, 5, `unquoted '>' needs a shell`},
		{`jq . < in`, 5, `unquoted '<' needs a shell`},
		{`a; b`, 1, `unquoted ';' needs a shell`},
		{`a && b`, 2, `unquoted '&' needs a shell`},
		{`sleep 1 &`, 8, `unquoted '&' needs a shell`},
		{`(a)`, 0, `unquoted '(' needs a shell`},
		{"echo `date`", 5, "unquoted '`' needs a shell"},
		{"jq\n-c .", 2, "unquoted newline separates commands"},
		{"jq -c .\n \nx", 7, "unquoted newline separates commands"},
	} {
		got, err := Split(tc.in)
		var se *SplitError
		if !errors.As(err, &se) {
			t.Errorf("Split(%q) = %q, %v; want a *SplitError %q", tc.in, got, err, tc.msg)
			continue
		}
		if se.Offset != tc.offset || !strings.Contains(se.Msg, tc.msg) {
			t.Errorf("Split(%q): error %q (offset %d), want %q at offset %d", tc.in, err, se.Offset, tc.msg, tc.offset)
		}
		if got != nil {
			t.Errorf("Split(%q) returned words %q with an error", tc.in, got)
		}
		if want := "at offset"; !strings.Contains(err.Error(), want) {
			t.Errorf("Split(%q): error %q does not say where", tc.in, err)
		}
	}
}

// TestSplitAgreesWithBash checks Split against bash's own word splitting
// for the cases where bash would not expand anything.
func TestSplitAgreesWithBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skipf("no bash: %v", err)
	}
	for _, tc := range splitCases {
		if strings.ContainsAny(tc.in, "$~*?#") || len(tc.want) == 0 || strings.TrimSpace(tc.in) != strings.Trim(tc.in, " \t") {
			continue // bash would expand, or see several (maybe empty) commands
		}
		out, err := exec.Command(bash, "-c", `printf '%s\0' `+tc.in).Output()
		if err != nil {
			t.Errorf("bash -c %q: %v", tc.in, err)
			continue
		}
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if !slices.Equal(got, tc.want) {
			t.Errorf("bash splits %q into %q, the table says %q", tc.in, got, tc.want)
		}
	}
}
