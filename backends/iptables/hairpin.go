package iptables

import (
	"fmt"
	"strings"

	"golang.org/x/net/bpf"
)

// sameAddrsProgram returns the classic BPF program (run by xt_bpf on the
// IP header) that returns 1 when a packet of family f has the same
// source and destination address, 0 otherwise: the test for hairpin
// traffic after DNAT.
func sameAddrsProgram(f family) []bpf.Instruction {
	// Source and destination offsets in the header, and the address
	// length, in 32-bit words.
	src, dst, words := uint32(12), uint32(16), 1
	if f == ipv6 {
		src, dst, words = 8, 24, 4
	}
	var prog []bpf.Instruction
	for w := range words {
		off := uint32(4 * w)
		// Instructions left after this word's jump: 4 per later word,
		// then "return 1"; a mismatch skips them all to "return 0".
		skip := uint8(4*(words-1-w) + 1)
		prog = append(prog,
			bpf.LoadAbsolute{Off: src + off, Size: 4},
			bpf.TAX{},
			bpf.LoadAbsolute{Off: dst + off, Size: 4},
			bpf.JumpIfX{Cond: bpf.JumpEqual, SkipFalse: skip},
		)
	}
	return append(prog, bpf.RetConstant{Val: 1}, bpf.RetConstant{Val: 0})
}

// sameAddrsBPF returns sameAddrsProgram(f) as xt_bpf's --bytecode
// argument: "count,op jt jf k,…".
func sameAddrsBPF(f family) string {
	raw, err := bpf.Assemble(sameAddrsProgram(f))
	if err != nil {
		panic(fmt.Sprintf("iptables: the hairpin BPF program does not assemble: %v", err)) // a bug in the fixed program above
	}
	parts := []string{fmt.Sprint(len(raw))}
	for _, r := range raw {
		parts = append(parts, fmt.Sprintf("%d %d %d %d", r.Op, r.Jt, r.Jf, r.K))
	}
	return strings.Join(parts, ",")
}
