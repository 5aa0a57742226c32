package callout

import (
	"fmt"
	"strings"
)

// SplitError is a syntax error in a command line given to Split.
type SplitError struct {
	// Offset is the byte offset in the input where the problem is: the
	// opening quote of an unterminated quoted string, or the offending
	// character.
	Offset int
	// Msg says what is wrong.
	Msg string
}

// Error implements error.
func (e *SplitError) Error() string {
	return fmt.Sprintf("%s at offset %d", e.Msg, e.Offset)
}

// operators are the characters that a shell treats as operators when they
// are not quoted (pipes, lists, redirections, subshells, command
// substitution). Split runs no shell, so it cannot honour them and rejects
// them rather than passing them to the program as arguments.
const operators = "|&;<>()`"

// Split splits a command line into a program and its arguments the way a
// POSIX shell splits words, without running a shell and without any
// expansion:
//
//   - unquoted blanks (spaces and tabs) separate words;
//   - 'single quotes' keep everything literally up to the next single quote;
//   - "double quotes" keep everything literally except the backslash
//     escapes \", \\, \$, \` and backslash-newline (a line continuation,
//     removed); any other backslash inside double quotes is kept;
//   - outside quotes, a backslash makes the next character literal, and
//     backslash-newline is removed;
//   - quoted parts may be adjacent to other text ("a"'b'c is one word,
//     abc), and an empty pair of quotes, single or double, is an empty
//     argument.
//
// $VARIABLES, ~, globs and # are not special: they are passed on literally.
// The unquoted shell operators | & ; < > ( ) ` and newline are errors (they
// would need a shell; use sh -c '...' as the command for that), as are an
// unterminated quote and a trailing backslash. Leading and trailing
// newlines are ignored. Blank or empty input gives no
// words and no error.
func Split(s string) ([]string, error) {
	var (
		words  []string
		word   strings.Builder
		inWord bool // word holds a word in progress (possibly empty: '')
		i      int
		n      = len(s)
	)
	endWord := func() {
		if inWord {
			words = append(words, word.String())
			word.Reset()
			inWord = false
		}
	}
	for i < n {
		c := s[i]
		switch {
		case c == ' ' || c == '\t':
			endWord()
			i++
		case c == '\\':
			if i+1 >= n {
				return nil, &SplitError{Offset: i, Msg: "trailing backslash"}
			}
			if s[i+1] != '\n' { // backslash-newline: a line continuation
				word.WriteByte(s[i+1])
				inWord = true
			}
			i += 2
		case c == '\'':
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, &SplitError{Offset: i, Msg: "unterminated single quote"}
			}
			word.WriteString(s[i+1 : i+1+end])
			inWord = true
			i += end + 2
		case c == '"':
			start := i
			i++
			closed := false
			for i < n {
				d := s[i]
				if d == '"' {
					closed = true
					i++
					break
				}
				if d == '\\' && i+1 < n {
					switch s[i+1] {
					case '"', '\\', '$', '`':
						word.WriteByte(s[i+1])
						i += 2
						continue
					case '\n':
						i += 2
						continue
					}
				}
				word.WriteByte(d)
				i++
			}
			if !closed {
				return nil, &SplitError{Offset: start, Msg: "unterminated double quote"}
			}
			inWord = true
		case c == '\n':
			// A newline separates commands; blank lines before or
			// after the only command are harmless.
			endWord()
			if len(words) > 0 && strings.TrimLeft(s[i:], " \t\n") != "" {
				return nil, &SplitError{Offset: i, Msg: "unquoted newline separates commands in a shell, which is not run (end the line with a backslash to continue it)"}
			}
			i++
		case strings.IndexByte(operators, c) >= 0:
			return nil, &SplitError{Offset: i, Msg: fmt.Sprintf("unquoted %q needs a shell, which is not run (quote it, or use sh -c '...')", c)}
		default:
			word.WriteByte(c)
			inWord = true
			i++
		}
	}
	endWord()
	return words, nil
}
