//! A network link in front of the storage: the ceiling the reference build's gigabit put on
//! everything it measured (`tank bench --link 1gbe`, `tank plan --link`).
//!
//! # Theory of operation
//! A [`LinkProfile`] is a bandwidth and a round-trip time. A [`Link`] paces the bytes of a
//! benchmark as that link would carry them: each direction (the link is full duplex) is a
//! clock of when it is next free; a transfer of `n` bytes books `n / bandwidth` on it from
//! the later of now and that time, and the caller waits until its bytes are on the wire,
//! less a window of `WINDOW` of booked time (the socket buffers and TCP window: a
//! streaming client keeps that much in flight, so the server's work overlaps the link's, and
//! a stream runs at the slower of the two). [`Link::drain`] waits for everything booked, as a
//! final fsync or close waits for the last bytes. Operations that carry no bulk data (create,
//! stat, unlink, the request of a random read) cost one round trip each, as an NFS or SMB
//! client waits for each reply.
//!
//! Several workers share one link, so parallel jobs split its bandwidth between them.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::BenchError;

const MB: f64 = 1e6;

/// Bytes a stream may have booked ahead of the wire (a TCP window): 4 MiB.
pub const WINDOW: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LinkProfile {
    /// Payload bytes per second in each direction (after Ethernet, IP and TCP framing).
    pub bandwidth: f64,
    /// Round-trip time of one request and its reply.
    pub rtt: Duration,
}

impl LinkProfile {
    /// `1gbe` (about 111 MB/s of payload, 0.15 ms round trips), `10gbe` (1,110 MB/s,
    /// 0.05 ms), `25gbe` (2,775 MB/s, 0.03 ms).
    pub fn parse(name: &str) -> Result<Self, BenchError> {
        let (mb, rtt_us) = match name.to_ascii_lowercase().as_str() {
            "1gbe" | "1g" => (111.0, 150),
            "10gbe" | "10g" => (1110.0, 50),
            "25gbe" | "25g" => (2775.0, 30),
            other => {
                return Err(BenchError::Invalid(format!(
                    "unknown link '{other}' (1gbe, 10gbe, 25gbe)"
                )))
            }
        };
        Ok(Self {
            bandwidth: mb * MB,
            rtt: Duration::from_micros(rtt_us),
        })
    }
}

/// A shared link between benchmark workers and the storage. See the module documentation.
#[derive(Debug)]
pub struct Link {
    pub profile: LinkProfile,
    /// When each direction is next free: [to the storage, from the storage].
    free_at: [Mutex<Option<Instant>>; 2],
}

/// The direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client to the storage (writes).
    Up,
    /// From the storage to the client (reads).
    Down,
}

impl Link {
    pub fn new(profile: LinkProfile) -> Self {
        Self {
            profile,
            free_at: [Mutex::new(None), Mutex::new(None)],
        }
    }

    /// Books `bytes` on the link in direction `dir` at `now`; returns when the caller may go on
    /// (its bytes are on the wire but for a window's worth).
    pub fn book(&self, dir: Direction, bytes: u64, now: Instant) -> Instant {
        let mut free = self.free_at[dir as usize].lock();
        let start = free.map_or(now, |f| f.max(now));
        let end = start + Duration::from_secs_f64(bytes as f64 / self.profile.bandwidth);
        *free = Some(end);
        let window = Duration::from_secs_f64(WINDOW as f64 / self.profile.bandwidth);
        end.checked_sub(window).unwrap_or(now).max(now)
    }

    /// Carries `bytes` in direction `dir`, waiting as the link would.
    pub fn transfer(&self, dir: Direction, bytes: u64) {
        let until = self.book(dir, bytes, Instant::now());
        sleep_until(until);
    }

    /// Waits until everything booked in direction `dir` is across.
    pub fn drain(&self, dir: Direction) {
        let until = *self.free_at[dir as usize].lock();
        if let Some(t) = until {
            sleep_until(t);
        }
    }

    /// One request and its reply with no bulk data.
    pub fn round_trip(&self) {
        std::thread::sleep(self.profile.rtt);
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles() {
        let g = LinkProfile::parse("1gbe").unwrap();
        assert!((g.bandwidth - 111e6).abs() < 1.0);
        assert!(LinkProfile::parse("10GbE").unwrap().bandwidth > 1e9);
        assert!(LinkProfile::parse("10mbit").is_err());
    }

    #[test]
    fn a_stream_books_back_to_back_and_keeps_a_window_in_flight() {
        let link = Link::new(LinkProfile::parse("1gbe").unwrap());
        let t0 = Instant::now();
        // 100 requests of 1 MiB issued at once: the link carries them one after the other.
        let mut last = t0;
        for _ in 0..100 {
            last = link.book(Direction::Up, 1 << 20, t0);
        }
        let all = (100u64 << 20) as f64 / 111e6;
        let window = WINDOW as f64 / 111e6;
        let waited = (last - t0).as_secs_f64();
        assert!((waited - (all - window)).abs() < 1e-6, "{waited} vs {all}");
        // The other direction is free (full duplex).
        assert_eq!(link.book(Direction::Down, 1 << 20, t0), t0);
        // A request after the link went idle starts at its own time.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(link.book(Direction::Up, 1 << 20, later), later);
    }

    #[test]
    fn a_paced_stream_runs_at_the_link_rate() {
        let link = Link::new(LinkProfile {
            bandwidth: 100e6,
            rtt: Duration::from_micros(100),
        });
        let t = Instant::now();
        for _ in 0..40 {
            link.transfer(Direction::Down, 1 << 20);
        }
        link.drain(Direction::Down);
        let rate = (40u64 << 20) as f64 / t.elapsed().as_secs_f64();
        // Sleeps only ever overshoot: the rate is at most the link's, and close to it.
        assert!(rate <= 100e6 * 1.001 && rate > 85e6, "{rate}");
    }
}
