//! Cache rules in `pagestored`'s configuration: `[[rule]]` tables in the TOML file and the
//! `--rule PREFIX:KEY=VALUE,...` flag, both turned into [`pagestore_engine::Rule`]s (the engine
//! validates the table and enforces it; see docs/OPERATIONS.md).

use std::time::Duration;

use pagestore_engine::Rule;

use pagestore_cli::parse_size;

/// One `[[rule]]` table of the config file.
#[derive(serde::Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Logical path prefix (whole components).
    pub prefix: String,
    /// Bytes of this node's cache: a size string (`"20GiB"`) or a number of bytes.
    pub quota: Option<toml::Value>,
    /// How long a page is served: a duration string (`"2h"`, `"500ms"`) or seconds.
    pub ttl: Option<toml::Value>,
    /// Never evict the rule's pages (up to 90% of the cache).
    pub pin: Option<bool>,
}

impl RuleConfig {
    /// The rule this table stands for; errors name the rule and the key, like [`parse_rule`]'s.
    pub fn to_rule(&self) -> Result<Rule, String> {
        let prefix = &self.prefix;
        let quota = match &self.quota {
            None => None,
            Some(toml::Value::String(s)) => {
                Some(parse_size(s).map_err(|e| format!("rule {prefix}: quota {e}"))?)
            }
            Some(toml::Value::Integer(n)) => Some(
                u64::try_from(*n).map_err(|_| format!("rule {prefix}: quota {n} is not a size"))?,
            ),
            Some(other) => {
                return Err(format!(
                    "rule {prefix}: quota: a {} is not a size (e.g. \"20GiB\" or bytes)",
                    other.type_str()
                ))
            }
        };
        let ttl = match &self.ttl {
            None => None,
            Some(toml::Value::String(s)) => {
                Some(parse_duration(s).map_err(|e| format!("rule {prefix}: ttl {e}"))?)
            }
            Some(toml::Value::Integer(n)) => {
                Some(Duration::from_secs(u64::try_from(*n).map_err(|_| {
                    format!("rule {prefix}: ttl {n} is negative")
                })?))
            }
            Some(toml::Value::Float(x)) => Some(
                Duration::try_from_secs_f64(*x)
                    .map_err(|_| format!("rule {prefix}: ttl {x} is not a duration we can use"))?,
            ),
            Some(other) => {
                return Err(format!(
                    "rule {prefix}: ttl: a {} is not a duration (e.g. \"2h\" or seconds)",
                    other.type_str()
                ))
            }
        };
        Ok(Rule {
            prefix: prefix.clone(),
            quota,
            ttl,
            pin: self.pin.unwrap_or(false),
        })
    }
}

/// Parses a duration: a number with an optional unit `ms`, `s`, `m`, `h` or `d` (no unit:
/// seconds); fractions are allowed (`1.5h`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), &t[split..]);
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => {
            return Err(format!(
                "{s:?}: unknown duration unit {unit:?} (use ms, s, m, h or d)"
            ))
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 500ms, 30s, 2h, 7d)"))?;
    Duration::try_from_secs_f64(n * scale)
        .map_err(|_| format!("{s:?} is not a duration we can use"))
}

/// Parses `PREFIX:KEY=VALUE,...` with keys `quota` (a size), `ttl` (a duration) and `pin`
/// (`true`/`false`). The prefix ends at the last `:`.
pub fn parse_rule(s: &str) -> Result<Rule, String> {
    let (prefix, opts) = s.rsplit_once(':').ok_or_else(|| {
        format!("--rule {s:?}: use PREFIX:KEY=VALUE,... (e.g. /data/a:quota=20G,ttl=2h,pin=true)")
    })?;
    let mut rule = Rule {
        prefix: prefix.to_string(),
        quota: None,
        ttl: None,
        pin: false,
    };
    for opt in opts.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        let (k, v) = opt
            .split_once('=')
            .ok_or_else(|| format!("rule {prefix}: {opt:?} is not KEY=VALUE"))?;
        let v = v.trim();
        match k.trim() {
            "quota" => {
                rule.quota = Some(parse_size(v).map_err(|e| format!("rule {prefix}: quota {e}"))?)
            }
            "ttl" => {
                rule.ttl = Some(parse_duration(v).map_err(|e| format!("rule {prefix}: ttl {e}"))?)
            }
            "pin" => {
                rule.pin = v
                    .parse()
                    .map_err(|_| format!("rule {prefix}: pin {v:?} is not true or false"))?
            }
            other => {
                return Err(format!(
                    "rule {prefix}: unknown key {other:?} (use quota, ttl or pin)"
                ))
            }
        }
    }
    Ok(rule)
}

/// A rule in one line, as `pagestored` prints it at start.
pub fn describe(rule: &Rule) -> String {
    let mut parts = vec![rule.prefix.clone()];
    if let Some(q) = rule.quota {
        parts.push(format!("quota={q}"));
    }
    if let Some(t) = rule.ttl {
        parts.push(format!("ttl={}ms", t.as_millis()));
    }
    if rule.pin {
        parts.push("pin".into());
    }
    parts.join(" ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1.5m").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86_400)
        );
        for bad in ["", "h", "2x", "-1s", "1e400s", "two hours"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rule_flags_and_tables() {
        let r = parse_rule("/data/a:quota=20GiB,ttl=2h,pin=true").unwrap();
        assert_eq!(r.prefix, "/data/a");
        assert_eq!(r.quota, Some(20 << 30));
        assert_eq!(r.ttl, Some(Duration::from_secs(7200)));
        assert!(r.pin);
        let r = parse_rule("/odd:name/x:ttl=1s").unwrap();
        assert_eq!(r.prefix, "/odd:name/x");
        for (bad, why) in [
            ("/a", "PREFIX:KEY=VALUE"),
            ("/a:quota", "KEY=VALUE"),
            ("/a:quota=lots", "quota"),
            ("/a:ttl=soon", "ttl"),
            ("/a:pin=yes", "pin"),
            ("/a:size=1G", "unknown key"),
        ] {
            let e = parse_rule(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let t: RuleConfig =
            toml::from_str("prefix = \"/d/\"\nquota = \"1G\"\nttl = 90\npin = false\n").unwrap();
        let back = t.to_rule().unwrap();
        assert_eq!(
            (back.quota, back.ttl, back.pin),
            (Some(1 << 30), Some(Duration::from_secs(90)), false)
        );
        let t: RuleConfig =
            toml::from_str("prefix = \"/d\"\nquota = 4096\nttl = \"1.5m\"\n").unwrap();
        let back = t.to_rule().unwrap();
        assert_eq!(
            (back.quota, back.ttl),
            (Some(4096), Some(Duration::from_secs(90)))
        );
        for (bad, why) in [
            ("quota = \"lots\"", "rule /d: quota"),
            ("quota = -1", "rule /d: quota"),
            ("ttl = \"soon\"", "rule /d: ttl"),
            ("ttl = -1", "rule /d: ttl"),
        ] {
            let t: RuleConfig = toml::from_str(&format!("prefix = \"/d\"\n{bad}\n")).unwrap();
            let e = t.to_rule().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        assert!(toml::from_str::<RuleConfig>("prefix = \"/d\"\nqouta = 1\n")
            .unwrap_err()
            .to_string()
            .contains("unknown field"));
        assert_eq!(
            describe(&parse_rule("/a:quota=1K,ttl=1s,pin=true").unwrap()),
            "/a quota=1024 ttl=1000ms pin"
        );
    }
}
