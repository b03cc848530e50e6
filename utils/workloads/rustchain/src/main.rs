//! A CPU-bound workload whose hot path is main -> rs_top -> rs_mid -> rs_leaf.
//! Usage: rustchain SECONDS
use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn rs_leaf(n: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..n {
        x = black_box(x.wrapping_add(i.wrapping_mul(i)));
    }
    x
}

#[inline(never)]
fn rs_mid(n: u64) -> u64 {
    black_box(rs_leaf(n)) ^ 1
}

#[inline(never)]
fn rs_top(n: u64) -> u64 {
    black_box(rs_mid(n)) ^ 2
}

fn main() {
    let seconds: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut sink = 0u64;
    while Instant::now() < end {
        sink ^= rs_top(2_000_000);
    }
    black_box(sink);
}
