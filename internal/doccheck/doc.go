// Package doccheck checks the documentation against the code: its test
// fails when README.md's layout table misses a package, when a relative
// link in README.md or docs/ points nowhere (a file, a directory or a
// heading anchor), or when a code span naming a repository path in those
// documents names one that does not exist. It runs in make unit.
package doccheck
