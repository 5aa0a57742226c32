package deploy_test

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// dockerfile is what the tests read from a Dockerfile: its global ARG
// defaults and its stages.
type dockerfile struct {
	args   map[string]string
	stages []*stage
}

// stage is one FROM and the instructions that follow it.
type stage struct {
	base, name   string
	instructions []instruction
}

// instruction is one instruction: its upper-case command, its --flags and
// its arguments split on white space (continuation lines joined).
type instruction struct {
	line  int
	cmd   string
	flags map[string]string
	args  []string
}

// stage returns the stage named name, or nil.
func (d *dockerfile) stage(name string) *stage {
	for _, s := range d.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

// all returns the stage's instructions of command cmd.
func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.instructions {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

var variable = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expand replaces $VAR and ${VAR} by their value in vars; a variable
// that vars does not hold is an error.
func expand(s string, vars map[string]string) (string, error) {
	var err error
	out := variable.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		v, ok := vars[name]
		if !ok && err == nil {
			err = fmt.Errorf("%s: no value for %s", s, name)
		}
		return v
	})
	return out, err
}

// parseDockerfile reads the Dockerfile at path: comments and blank lines
// skipped, continuation lines joined, global ARGs recorded and expanded in
// FROM lines.
func parseDockerfile(path string) (*dockerfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open Dockerfile: %w", err)
	}
	defer f.Close()
	d := &dockerfile{args: map[string]string{}}
	sc := bufio.NewScanner(f)
	var pending string
	start, n := 0, 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if pending == "" {
			start = n
		}
		if strings.HasSuffix(line, `\`) {
			pending += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		if err := d.add(start, pending+line); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, start, err)
		}
		pending = ""
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read Dockerfile: %w", err)
	}
	if pending != "" {
		return nil, fmt.Errorf("%s:%d: continuation line at the end of the file", path, start)
	}
	if len(d.stages) == 0 {
		return nil, fmt.Errorf("%s: no FROM", path)
	}
	return d, nil
}

func (d *dockerfile) add(line int, text string) error {
	words := strings.Fields(text)
	in := instruction{line: line, cmd: strings.ToUpper(words[0]), flags: map[string]string{}}
	rest := words[1:]
	for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
		k, v, _ := strings.Cut(strings.TrimPrefix(rest[0], "--"), "=")
		in.flags[k] = v
		rest = rest[1:]
	}
	in.args = rest
	switch {
	case in.cmd == "ARG" && len(d.stages) == 0:
		for _, a := range in.args {
			k, v, _ := strings.Cut(a, "=")
			// A default may name the ARGs before it.
			v, err := expand(v, d.args)
			if err != nil {
				return fmt.Errorf("ARG %s: %w", k, err)
			}
			d.args[k] = v
		}
		return nil
	case in.cmd == "FROM":
		if len(in.args) != 1 && (len(in.args) != 3 || !strings.EqualFold(in.args[1], "AS")) {
			return fmt.Errorf("FROM %s: want an image and an optional AS name", strings.Join(in.args, " "))
		}
		base, err := expand(in.args[0], d.args)
		if err != nil {
			return fmt.Errorf("FROM: %w", err)
		}
		s := &stage{base: base}
		if len(in.args) == 3 {
			s.name = in.args[2]
		}
		d.stages = append(d.stages, s)
		return nil
	case len(d.stages) == 0:
		return fmt.Errorf("%s before the first FROM", in.cmd)
	}
	s := d.stages[len(d.stages)-1]
	s.instructions = append(s.instructions, in)
	return nil
}
