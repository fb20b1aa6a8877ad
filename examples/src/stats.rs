//! Per-iteration times and their percentiles: what every tool records in
//! its timed loop ([`IterTimes`]), what it reports beside the average
//! ([`Tail`]: p50, p99, p99.9, min and max), and how the table and `--json`
//! show them.
//!
//! The timed loop only stores numbers into memory sized before the loop,
//! so recording allocates nothing per message; the histogram
//! (`hdrhistogram`, three significant digits) is built after the loop.
//! `FABRIC_MSG_ITER_TIMES=off` turns the per-iteration clock reads off, to
//! measure what the timing itself costs (`ci/bench/iter_times_cost.sh`;
//! docs/benchmarks.md, "Percentiles in every tool").

use hdrhistogram::Histogram;
use std::time::Instant;

/// The environment variable that turns per-iteration timing off (`off` or
/// `0`); anything else, or nothing, leaves it on.
pub const ITER_TIMES_ENV: &str = "FABRIC_MSG_ITER_TIMES";

/// Whether the tools time each iteration (see [`ITER_TIMES_ENV`]).
pub fn iter_times_on() -> bool {
    !matches!(std::env::var(ITER_TIMES_ENV).as_deref(), Ok("off" | "0"))
}

/// Times of a size's measured iterations, in nanoseconds per transfer,
/// recorded into a vector sized before the loop.
#[derive(Debug)]
pub struct IterTimes {
    on: bool,
    nanos: Vec<u64>,
    last: Instant,
}

impl IterTimes {
    /// Room for `iterations` times; with timing off, none is kept.
    pub fn new(iterations: usize) -> IterTimes {
        let on = iter_times_on();
        IterTimes {
            on,
            nanos: Vec::with_capacity(if on { iterations } else { 0 }),
            last: Instant::now(),
        }
    }

    /// Room for `iterations` times, kept whatever [`ITER_TIMES_ENV`] says:
    /// for loops that time every iteration anyway (world_bench's latency
    /// and collectives, as OSU's do), where only the storing is new, and
    /// where every rank must record alike.
    pub fn always(iterations: usize) -> IterTimes {
        IterTimes {
            on: true,
            nanos: Vec::with_capacity(iterations),
            last: Instant::now(),
        }
    }

    /// Whether iterations are timed.
    pub fn on(&self) -> bool {
        self.on
    }

    /// The measured iterations begin at `at` (the clock the average uses):
    /// forget earlier laps.
    pub fn start(&mut self, at: Instant) {
        self.nanos.clear();
        self.last = at;
    }

    /// An iteration of `per` transfers has ended: its time since the
    /// previous lap (or [`IterTimes::start`]), divided by `per`. Past the
    /// room made in [`IterTimes::new`] laps are dropped, never allocated.
    #[inline]
    pub fn lap(&mut self, per: usize) {
        if self.on {
            let now = Instant::now();
            self.record(now.duration_since(self.last).as_nanos() as u64 / per.max(1) as u64);
            self.last = now;
        }
    }

    /// The measured time from `start`: to the last lap, so that the
    /// average and the percentiles come from the same clock reads (a
    /// preemption after the last lap cannot put the average above the
    /// slowest iteration); to now with timing off or no lap.
    pub fn elapsed_since(&self, start: Instant) -> std::time::Duration {
        if self.on && !self.nanos.is_empty() {
            self.last.duration_since(start)
        } else {
            start.elapsed()
        }
    }

    /// Record a time measured elsewhere, in nanoseconds per transfer.
    #[inline]
    pub fn record(&mut self, nanos: u64) {
        if self.on && self.nanos.len() < self.nanos.capacity() {
            self.nanos.push(nanos);
        }
    }

    /// The recorded times, in order.
    pub fn nanos(&self) -> &[u64] {
        &self.nanos
    }

    /// The recorded times, to combine with other ranks' in place.
    pub fn nanos_mut(&mut self) -> &mut [u64] {
        &mut self.nanos
    }

    /// Their percentiles, or `None` with timing off or nothing recorded.
    pub fn tail(&self) -> Option<Tail> {
        Tail::of(&self.nanos)
    }
}

/// The distribution of per-iteration times, microseconds per transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tail {
    /// Fastest iteration.
    pub min: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Slowest iteration.
    pub max: f64,
    /// How many iterations.
    pub count: u64,
}

impl Tail {
    /// The percentiles of `nanos`, or `None` if it is empty. Values are
    /// kept to three significant digits (hdrhistogram's precision here):
    /// within 0.1 %, `min` rounded down, the others up.
    pub fn of(nanos: &[u64]) -> Option<Tail> {
        if nanos.is_empty() {
            return None;
        }
        // 1 ns to an hour: any time a tool can take. Out of range cannot
        // happen below; a value above is clamped to the top.
        let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).ok()?;
        for &n in nanos {
            h.saturating_record(n.max(1));
        }
        let us = |v: u64| v as f64 / 1e3;
        Some(Tail {
            min: us(h.min()),
            p50: us(h.value_at_quantile(0.5)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
            count: h.len(),
        })
    }

    /// Add `p50_us`, `p99_us`, `p999_us`, `min_us` and `max_us` to a JSON
    /// object.
    pub fn add_json(&self, v: &mut serde_json::Value) {
        v["p50_us"] = self.p50.into();
        v["p99_us"] = self.p99.into();
        v["p999_us"] = self.p999.into();
        v["min_us"] = self.min.into();
        v["max_us"] = self.max.into();
    }
}

/// The table's percentile column names, each `width` wide.
pub fn columns(width: usize) -> String {
    ["p50", "p99", "p99.9", "max"]
        .iter()
        .map(|c| format!(" {c:>width$}"))
        .collect()
}

/// A row's percentile columns (`-` for each with timing off), each `width`
/// wide, two decimals.
pub fn cells(tail: Option<&Tail>, width: usize) -> String {
    match tail {
        Some(t) => [t.p50, t.p99, t.p999, t.max]
            .iter()
            .map(|v| format!(" {v:>width$.2}"))
            .collect(),
        None => (0..4).map(|_| format!(" {:>width$}", "-")).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::{cells, Tail};

    #[test]
    fn percentiles_of_a_known_distribution() {
        // 1..=1000 µs: p50 500, p99 990, p99.9 999, within 0.1 %.
        let nanos: Vec<u64> = (1..=1000).map(|k| k * 1000).collect();
        let t = Tail::of(&nanos).expect("not empty");
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(near(t.min, 1.0), "{t:?}");
        assert!(near(t.p50, 500.0), "{t:?}");
        assert!(near(t.p99, 990.0), "{t:?}");
        assert!(near(t.p999, 999.0), "{t:?}");
        assert!(near(t.max, 1000.0), "{t:?}");
        assert_eq!(t.count, 1000);
        assert!(t.min <= t.p50 && t.p50 <= t.p99 && t.p99 <= t.p999 && t.p999 <= t.max);
        assert_eq!(Tail::of(&[]), None);
    }

    #[test]
    fn one_slow_iteration_shows_in_the_tail_only() {
        let mut nanos = vec![2_000u64; 999];
        nanos.push(5_000_000);
        let t = Tail::of(&nanos).expect("not empty");
        assert!(t.p50 < 2.01 && t.p99 < 2.01, "{t:?}");
        assert!(t.max > 4_990.0, "{t:?}");
        assert_eq!(cells(None, 5), "     -     -     -     -");
    }
}
