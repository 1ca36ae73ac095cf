//! What is wrong with a configuration: one typed error per kind of problem, each naming
//! the file or the field.

use super::file::MAX_FILE_BYTES;
use super::PRESETS;
use std::fmt;
use std::path::PathBuf;

/// What is wrong with a configuration.
#[derive(Clone, Debug, PartialEq)]
pub enum ConfigError {
    /// The file cannot be opened, read or (by `Config::write`) written.
    Io {
        /// The file.
        path: PathBuf,
        /// What failed: the operating system's error, or why the configuration cannot be
        /// written in the file's format.
        error: String,
    },
    /// The file is over `MAX_FILE_BYTES` (1 MiB).
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// The file's extension is neither `.toml` nor `.json`.
    Extension {
        /// The file.
        path: PathBuf,
    },
    /// The file is not valid TOML/JSON, or has unknown fields or values of a wrong type.
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (it names the line or the field).
        error: String,
    },
    /// A name that is not one of the known ones.
    UnknownName {
        /// What kind of name: `transport`, `manager`, `injected bug`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The known names, comma-separated.
        known: &'static str,
    },
    /// A transaction-policy preset that does not exist.
    UnknownMode {
        /// The preset name given (`txn.mode`).
        mode: String,
    },
    /// A per-phase policy choice that does not exist (`txn.execute = "magic"`).
    UnknownChoice {
        /// The configuration field, `txn.execute`.
        field: &'static str,
        /// Its command-line flag, `--execute`.
        flag: &'static str,
        /// The choice given.
        value: String,
        /// The choices that exist.
        allowed: &'static [&'static str],
    },
    /// A value out of its range, or settings that contradict each other.
    Invalid {
        /// The configuration field, `cluster.replication`.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Io { path, error } => {
                write!(f, "cannot read config file {}: {error}", path.display())
            }
            ConfigError::TooLarge { path } => write!(
                f,
                "config file {} is larger than {MAX_FILE_BYTES} bytes",
                path.display()
            ),
            ConfigError::Extension { path } => write!(
                f,
                "config file {}: the name must end in .toml or .json",
                path.display()
            ),
            ConfigError::Parse { path, error } => {
                write!(f, "config file {}: {error}", path.display())
            }
            ConfigError::UnknownName { what, name, known } => {
                write!(f, "unknown {what} {name:?} ({known})")
            }
            ConfigError::UnknownMode { mode } => write!(
                f,
                "txn.mode (--mode) {mode:?}: no such preset; the presets are: {}",
                PRESETS.join(", ")
            ),
            ConfigError::UnknownChoice {
                field,
                flag,
                value,
                allowed,
            } => write!(
                f,
                "{field} ({flag}) {value:?}: no such choice; the choices are: {}",
                allowed.join(", ")
            ),
            ConfigError::Invalid { field, why } => write!(f, "{field}: {why}"),
        }
    }
}

impl std::error::Error for ConfigError {}

pub(super) fn invalid<T>(field: &'static str, why: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        field,
        why: why.into(),
    })
}
