"""agent/bpf_syscall.py's pure parts: linking kfunc calls into BCC's bytecode, and what
the agent says when the verifier refuses a handler (the loads themselves run against the
kernel in tests/integration/test_probe_loopback.py)."""

from __future__ import annotations

import struct

from azprobe.agent.bpf_syscall import BPF_CALL, BPF_PSEUDO_KFUNC_CALL, link_kfuncs, verifier_verdict

REFUSAL = """0: R1=ctx() R10=fp0
0: (79) r6 = *(u64 *)(r1 +0)
func 'inet_sock_set_state' arg0 has btf_id 2953 type STRUCT 'sock'
16: (2f) r2 *= r1
math between trusted_ptr_ pointer and -7046029254386353131 is not allowed
processed 16 insns (limit 1000000) max_states_per_insn 0 total_states 1 peak_states 1 mark_read 0
"""


def test_the_verdict_is_the_reason_not_the_statistics():
    assert verifier_verdict(REFUSAL) == "math between trusted_ptr_ pointer and -7046029254386353131 is not allowed"


def test_an_empty_log_says_so():
    assert verifier_verdict("") == "no verifier log"
    assert verifier_verdict("processed 1 insns (limit 1000000)\n") == "no verifier log"


def _insn(code: int, regs: int, off: int, imm: int) -> bytes:
    return struct.pack("<BBhi", code, regs, off, imm)


def test_placeholder_helper_calls_become_kfunc_calls_and_nothing_else_changes():
    placeholder = 32752
    program = b"".join([
        _insn(0xBF, 0x61, 0, 0),              # r1 = r6
        _insn(BPF_CALL, 0, 0, placeholder),   # call the placeholder
        _insn(BPF_CALL, 0, 0, 1),             # call map_lookup_elem (a real helper)
        _insn(0xB7, 0, 0, placeholder),       # r0 = 32752: not a call
        _insn(0x95, 0, 0, 0),                 # exit
    ])
    linked = link_kfuncs(program, {placeholder: 65504})
    assert len(linked) == len(program)
    assert linked[8:16] == _insn(BPF_CALL, BPF_PSEUDO_KFUNC_CALL << 4, 0, 65504)
    assert linked[:8] + linked[16:] == program[:8] + program[16:]
    assert link_kfuncs(program, {}) == program
