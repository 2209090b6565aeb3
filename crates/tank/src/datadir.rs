//! The data directory and the pool cache file.
//!
//! # Theory of operation
//! The data directory is `$TANK_DATA_DIR` when set, else `./tank-data`, made absolute once
//! against the working directory the program started in (`data_dir` remembers it), so every
//! path derived from it (device files, the socket, mount points, which must be absolute) is
//! absolute however the program was started. It holds
//! `pools.json`, the list of imported pools with their member device paths (zpool.cache's
//! role: a command can open a pool by name without scanning), the default pool's device files,
//! and the CLI's own state. The cache only locates devices; the pool's truth is on its devices.

use std::path::{Path, PathBuf};

/// The data directory, absolute: resolved at the first call (`main` makes it at start) and
/// the same for the life of the process.
pub fn data_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::var_os("TANK_DATA_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("tank-data"));
        absolute(&dir)
    })
    .clone()
}

/// `dir` made absolute against the working directory, without resolving symbolic links and
/// with `.` components dropped (a relative `./tank-data` becomes `$PWD/tank-data`). When the
/// working directory cannot be read the path is kept as given, and whatever uses it says so.
fn absolute(dir: &Path) -> PathBuf {
    std::path::absolute(dir)
        .map(|p| p.components().collect())
        .unwrap_or_else(|_| dir.to_path_buf())
}

pub use tank_service::pools::PoolCache;

/// Sizes as the commands parse and show them (the runners' own).
pub use tank_bench::run::util::{human, parse_size};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_dir_is_absolute() {
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(absolute(Path::new("tank-data")), cwd.join("tank-data"));
        assert_eq!(absolute(Path::new("./tank-data/")), cwd.join("tank-data"));
        assert_eq!(absolute(Path::new("/srv/tank")), PathBuf::from("/srv/tank"));
        assert!(data_dir().is_absolute());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("16GiB").unwrap(), 16 << 30);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1G").is_err());
        assert_eq!(human(1536 << 20), "1.50G");
        assert_eq!(human(512), "512");
    }
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert!(parse_size("x").is_err());
        assert!(parse_size("-1G").is_err());
    }
}
