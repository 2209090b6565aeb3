//! What the runners share: the data directory (where their scratch directories and the
//! benchmark history go) and the parsers of sizes and record sizes.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::Result;

static DATA_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Sets the data directory the runners use (the binary's, resolved once at its start).
pub fn set_data_dir(dir: PathBuf) {
    let _ = DATA_DIR.set(dir);
}

/// The data directory: as set, else `$TANK_DATA_DIR` or `./tank-data`, made absolute.
pub fn data_dir() -> PathBuf {
    DATA_DIR
        .get_or_init(|| {
            let dir = std::env::var_os("TANK_DATA_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("tank-data"));
            std::path::absolute(&dir).unwrap_or(dir)
        })
        .clone()
}

/// Parses a size such as `512`, `64K`, `1.5G`, `16GiB` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64> {
    tank_dataset::props::parse_size(s, false).map_err(|e| anyhow::anyhow!(e))
}

/// The largest record size of a dataset (and so of anything measured through one).
pub const DATASET_MAX_RECORD: u64 = 1 << 20;

/// A record size for the benchmarks: a power of two from 512 bytes to `max`.
pub fn parse_recordsize(s: &str, max: u64) -> Result<u32> {
    let r = parse_size(s)?;
    if !r.is_power_of_two() || !(512..=max).contains(&r) {
        anyhow::bail!(
            "invalid record size '{s}': a power of two from 512 to {}",
            human(max)
        );
    }
    Ok(r as u32)
}

/// Bytes as zpool shows them: 1.50G, 512M, 4K (below 1K without a unit).
pub fn human(bytes: u64) -> String {
    if bytes < 1024 {
        bytes.to_string()
    } else {
        tank_dataset::props::human(bytes)
    }
}
