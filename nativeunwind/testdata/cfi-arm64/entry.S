/* Hand-written CFI: an entry point whose return address is undefined, a
 * signal trampoline (augmentation "S") and remember/restore_state. */
	.text
	.globl	_start
	.type	_start, %function
_start:
	.cfi_startproc
	.cfi_undefined x30
	mov	x29, #0
	mov	x30, #0
	bl	top
	b	.
	.cfi_endproc
	.size	_start, .-_start

	.cfi_startproc
	.cfi_signal_frame
	.cfi_def_cfa x29, 0
	.cfi_offset x29, 0
	.cfi_offset x30, 8
	nop
	.globl	__kernel_rt_sigreturn
	.type	__kernel_rt_sigreturn, %function
__kernel_rt_sigreturn:
	mov	x8, #139
	svc	#0
	.cfi_endproc
	.size	__kernel_rt_sigreturn, .-__kernel_rt_sigreturn

	.globl	twoexits
	.type	twoexits, %function
twoexits:
	.cfi_startproc
	stp	x29, x30, [sp, #-32]!
	.cfi_def_cfa_offset 32
	.cfi_offset x29, -32
	.cfi_offset x30, -24
	mov	x29, sp
	cbz	x0, 1f
	.cfi_remember_state
	ldp	x29, x30, [sp], #32
	.cfi_restore x30
	.cfi_restore x29
	.cfi_def_cfa_offset 0
	ret
1:
	.cfi_restore_state
	bl	leaf
	ldp	x29, x30, [sp], #32
	.cfi_restore x30
	.cfi_restore x29
	.cfi_def_cfa_offset 0
	ret
	.cfi_endproc
	.size	twoexits, .-twoexits
