//! A small command-line parser for the example binaries: `--name value`, `--name=value` and
//! `--flag`.

use std::str::FromStr;

/// Parsed `--name value` options.
#[derive(Debug, Default)]
pub struct Args {
    options: Vec<(String, Option<String>)>,
}

impl Args {
    /// Parses the process arguments. Prints `usage` and exits on `--help`; prints an error and
    /// exits with status 2 on an option not in `known` (names without `--`).
    pub fn from_env(usage: &str, known: &[&str]) -> Args {
        match Args::parse(std::env::args().skip(1), known) {
            Ok(args) if args.flag("help") => {
                println!("{usage}");
                std::process::exit(0);
            }
            Ok(args) => args,
            Err(message) => {
                eprintln!("{message}\n\n{usage}");
                std::process::exit(2);
            }
        }
    }

    /// Parses `args`.
    ///
    /// # Errors
    /// An unknown option or a stray value.
    pub fn parse(args: impl IntoIterator<Item = String>, known: &[&str]) -> Result<Args, String> {
        let mut options: Vec<(String, Option<String>)> = Vec::new();
        for arg in args {
            if let Some(name) = arg.strip_prefix("--") {
                let (name, value) = match name.split_once('=') {
                    Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                    None => (name.to_owned(), None),
                };
                if name != "help" && !known.contains(&name.as_str()) {
                    return Err(format!("unknown option --{name}"));
                }
                options.push((name, value));
            } else {
                match options.last_mut() {
                    Some((_, value @ None)) => *value = Some(arg),
                    _ => return Err(format!("unexpected argument {arg:?}")),
                }
            }
        }
        Ok(Args { options })
    }

    /// Whether `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.options.iter().any(|(n, _)| n == name)
    }

    /// The last value of `--name`.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.values(name).pop()
    }

    /// Every value of `--name`, comma-separated lists split.
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.options
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.as_deref())
            .flat_map(|v| v.split(',').filter(|s| !s.is_empty()))
            .collect()
    }

    /// The value of `--name` parsed, or `default` when it is absent.
    ///
    /// # Errors
    /// A value that does not parse.
    pub fn parsed<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{name}: cannot use {v:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_flags_and_lists() {
        let argv = [
            "--target",
            "a,b",
            "--target=c",
            "--check",
            "--requests",
            "5",
        ];
        let args = Args::parse(argv.map(String::from), &["target", "check", "requests"]).unwrap();
        assert_eq!(args.values("target"), ["a", "b", "c"]);
        assert!(args.flag("check"));
        assert_eq!(args.parsed("requests", 1usize), Ok(5));
        assert_eq!(args.parsed("missing", 7u32), Ok(7));
        assert!(Args::parse(["--nope".to_owned()], &[]).is_err());
        assert!(Args::parse(["stray".to_owned()], &[]).is_err());
    }
}
