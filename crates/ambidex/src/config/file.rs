//! Reading a configuration file (TOML or JSON, by extension) over a path's defaults,
//! and writing one for node processes.

use super::{Config, ConfigError};
use std::path::Path;

/// Largest configuration file read (they are a few hundred bytes in practice).
pub(super) const MAX_FILE_BYTES: u64 = 1 << 20;

/// Lays `over` onto `base`: objects merge key by key, anything else replaces.
fn merge(base: &mut serde_json::Value, over: serde_json::Value) {
    match (base, over) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

impl Config {
    /// Reads a TOML (`.toml`) or JSON (`.json`) file laid over `base` (the path's
    /// defaults): what the file leaves out keeps `base`'s value. Not yet validated.
    pub fn read(path: &Path, base: &Config) -> Result<Config, ConfigError> {
        use std::io::Read;
        let io = |e: std::io::Error| ConfigError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(io)?
            .take(MAX_FILE_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(io)?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        let parse = |error: String| ConfigError::Parse {
            path: path.to_path_buf(),
            error,
        };
        let value: serde_json::Value = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::from_str(&text).map_err(|e| parse(e.to_string()))?,
            Some("json") => serde_json::from_str(&text).map_err(|e| parse(e.to_string()))?,
            _ => {
                return Err(ConfigError::Extension {
                    path: path.to_path_buf(),
                })
            }
        };
        // A bad per-phase choice is named with its field before serde sees it.
        super::policy::check_file(&value)?;
        Config::over(base, value).map_err(|e| parse(e.to_string()))
    }

    /// `over` (a parsed file) laid onto `base`.
    pub fn over(base: &Config, over: serde_json::Value) -> Result<Config, serde_json::Error> {
        if !over.is_object() {
            return Err(serde::de::Error::custom(
                "the configuration must be a table (object) of sections",
            ));
        }
        let mut v = serde_json::to_value(base)?;
        merge(&mut v, over);
        let mut c: Config = serde_json::from_value(v)?;
        c.run.progress = base.run.progress;
        Ok(c)
    }

    /// Writes the configuration for node processes: TOML for a `*.toml` path (as
    /// [`Config::read`] reads it back), JSON otherwise.
    pub fn write(&self, path: &Path) -> Result<(), ConfigError> {
        let text = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => toml::to_string_pretty(self).map_err(|e| ConfigError::Io {
                path: path.to_path_buf(),
                error: format!("cannot write it as TOML: {e}"),
            })?,
            _ => serde_json::to_string_pretty(self).expect("a config serializes"),
        };
        std::fs::write(path, text + "\n").map_err(|e| ConfigError::Io {
            path: path.to_path_buf(),
            error: e.to_string(),
        })
    }
}
