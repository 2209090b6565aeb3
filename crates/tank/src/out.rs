//! Command output, and paths as the user meant them.
//!
//! # Theory of operation
//! Commands print through `outln!`/`out!`/`errln!`: standard output flushed at each write
//! (a long command's lines appear as they come), standard error unbuffered. Paths given on
//! the command line are made absolute here, against this process's directory, before they
//! go into a request: the daemon that runs it has a directory of its own.

use std::io::Write;

/// A path as the user meant it: a relative one against this process's directory.
pub fn resolve(path: &std::path::Path) -> std::path::PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    match std::env::current_dir() {
        Ok(b) => b.join(path),
        Err(_) => path.to_path_buf(),
    }
}

/// `KEY=VALUE` arguments as pairs; anything else is refused with the argument named.
pub fn pairs(items: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => anyhow::bail!("expected KEY=VALUE, got '{s}'"),
        })
        .collect()
}

pub fn write_out(s: &str) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(s.as_bytes());
    let _ = o.flush();
}

pub fn write_err(s: &str) {
    let _ = std::io::stderr().lock().write_all(s.as_bytes());
}

#[macro_export]
macro_rules! outln {
    () => { $crate::out::write_out("\n") };
    ($($t:tt)*) => { $crate::out::write_out(&format!("{}\n", format_args!($($t)*))) };
}

#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::write_out(&format!($($t)*)) };
}

#[macro_export]
macro_rules! errln {
    ($($t:tt)*) => { $crate::out::write_err(&format!("{}\n", format_args!($($t)*))) };
}

/// An error with its causes, each once (`tank_service::error::chain`).
pub fn chain(e: &anyhow::Error) -> String {
    tank_service::error::chain(e)
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        // As thiserror makes it of `#[error("{dev}: cannot open: {source}")]`.
        #[derive(Debug)]
        struct Open(std::io::Error);
        impl std::fmt::Display for Open {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "d0: cannot open: {}", self.0)
            }
        }
        impl std::error::Error for Open {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = anyhow::Error::new(Open(io)).context("cannot open pool 'pw'");
        assert_eq!(
            chain(&e),
            "cannot open pool 'pw': d0: cannot open: No such file or directory (os error 2)"
        );
        // A cause the message does not name is kept.
        let e = anyhow::anyhow!("permission denied").context("cannot open 'd0'");
        assert_eq!(chain(&e), "cannot open 'd0': permission denied");
    }
}
