//! Command output that the daemon can capture.
//!
//! # Theory of operation
//! Commands print through `outln!`/`out!`/`errln!` instead of `println!`. In the CLI these
//! go to stdout and stderr. When the daemon runs a command for a client, it runs it on its
//! own thread inside `capture`, which collects that thread's output for the reply; other
//! threads are untouched.

use std::cell::RefCell;
use std::io::Write;

#[derive(Debug, Default, Clone)]
pub struct Captured {
    pub stdout: String,
    pub stderr: String,
}

thread_local! {
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
    static COMMAND: RefCell<Option<String>> = const { RefCell::new(None) };
    /// The working directory of the client whose command this daemon thread runs.
    static CLIENT_DIR: RefCell<Option<std::path::PathBuf>> = const { RefCell::new(None) };
}

/// Runs `f` with relative paths resolved against `dir`, the client's working directory (a
/// daemon thread cannot change the process's own).
pub fn with_client_dir<R>(dir: Option<std::path::PathBuf>, f: impl FnOnce() -> R) -> R {
    CLIENT_DIR.with(|c| *c.borrow_mut() = dir);
    let r = f();
    CLIENT_DIR.with(|c| *c.borrow_mut() = None);
    r
}

/// A path as the user meant it: a relative one against the working directory of the
/// command's client (in the daemon) or of this process.
pub fn resolve(path: &std::path::Path) -> std::path::PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    let base = CLIENT_DIR
        .with(|c| c.borrow().clone())
        .or_else(|| std::env::current_dir().ok());
    match base {
        Some(b) => b.join(path),
        None => path.to_path_buf(),
    }
}

/// The command line a client sent, for the pool history (None in the CLI).
pub fn command() -> Option<String> {
    COMMAND.with(|c| c.borrow().clone())
}

pub fn write_out(s: &str) {
    let captured = CAPTURE.with(|c| {
        if let Some(buf) = c.borrow_mut().as_mut() {
            buf.stdout.push_str(s);
            true
        } else {
            false
        }
    });
    if !captured {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(s.as_bytes());
        let _ = o.flush();
    }
}

pub fn write_err(s: &str) {
    let captured = CAPTURE.with(|c| {
        if let Some(buf) = c.borrow_mut().as_mut() {
            buf.stderr.push_str(s);
            true
        } else {
            false
        }
    });
    if !captured {
        let _ = std::io::stderr().lock().write_all(s.as_bytes());
    }
}

/// Runs `f` for a client's `command` with this thread's output collected.
pub fn capture<R>(command: String, f: impl FnOnce() -> R) -> (R, Captured) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(Captured::default()));
    COMMAND.with(|c| *c.borrow_mut() = Some(command));
    let r = f();
    COMMAND.with(|c| *c.borrow_mut() = None);
    let out = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (r, out)
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

/// An error with its causes, as `{:#}` prints it ("outer: cause: root cause"), but a cause
/// whose words already stand in what precedes it is left out: many errors name their
/// source in their own message and also return it as `source()`, which `{:#}` would print
/// twice ("cannot open: No such file or directory (os error 2): No such file or directory
/// (os error 2)").
pub fn chain(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if text.is_empty() {
            text = s;
        } else if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
    }
    text
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
