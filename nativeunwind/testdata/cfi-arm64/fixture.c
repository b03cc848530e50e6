/* Compiled with -mbranch-protection=pac-ret+b-key: the CFI of these
 * functions signs the return address (augmentation "B",
 * DW_CFA_AARCH64_negate_ra_state). */
int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) int mid(int x) { return leaf(x) + leaf(x + 1); }
/* alloca makes GCC keep CFA = x29 + 16. */
__attribute__((noinline)) int dyn(int n) {
	volatile char *p = __builtin_alloca(n);
	for (int i = 0; i < n; i++)
		p[i] = i;
	return mid(p[n / 2]);
}
int top(int n) { return dyn(n) + mid(n); }
