//! A server clock the test controls: `redis-server` started with a small preloaded library
//! (`clockshift.c`, compiled here with the C compiler on first use) that shifts its wall clock
//! by the number of seconds a file holds, read again at every clock call, so the test moves the
//! clock of a running server by rewriting the file. Only the wall clock moves (`TIME`, key
//! expiry); the monotonic clock Redis times its event loop with stays real.
//!
//! (libfaketime does the same, but its initialisation recurses with the allocator Redis links
//! statically, and the server does not start.)

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::process;

/// The wall clock of every `redis-server` this process starts after [`FakeClock::install`].
#[derive(Debug)]
pub struct FakeClock {
    dir: tempfile::TempDir,
}

impl FakeClock {
    /// Runs every `redis-server` started from now on in this process with a wall clock that
    /// [`set_offset`](Self::set_offset) moves (at the real time until then).
    ///
    /// # Panics
    ///
    /// When the library cannot be compiled (`cc`, or `$CC`, must be installed).
    pub fn install() -> FakeClock {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let source = dir.path().join("clockshift.c");
        let library = dir.path().join("clockshift.so");
        std::fs::write(&source, include_str!("clockshift.c")).expect("write the shim's source");
        let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&library)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("cannot run the C compiler {cc:?}: {e}"));
        assert!(
            status.success(),
            "{cc:?} could not compile {}",
            source.display()
        );
        let clock = FakeClock { dir };
        clock.set_offset(0);
        let vars: Vec<(OsString, OsString)> = vec![
            ("LD_PRELOAD".into(), library.into()),
            ("CLOCKSHIFT_FILE".into(), clock.file().into()),
        ];
        process::set_server_env(vars);
        clock
    }

    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// Sets the servers' wall clock `seconds` away from the real one (negative: behind), from
    /// their next clock call on.
    ///
    /// # Panics
    ///
    /// When the file cannot be written.
    pub fn set_offset(&self, seconds: i64) {
        write(&self.file(), &format!("{seconds}\n"));
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        process::set_server_env(Vec::new());
    }
}

fn write(file: &Path, text: &str) {
    // written whole, then renamed over the old one: the server never reads half a number
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", tmp.display()));
    std::fs::rename(&tmp, file).unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
}
