//! A strict reader of the OpenMetrics text a node's `/metrics` serves, for tests: it panics on
//! anything a scraper would reject or misread.

use std::collections::BTreeMap;

/// `(sample name, labels as written)` → value.
pub type Samples = BTreeMap<(String, String), f64>;

/// Parses `text`, panicking (with the offending line) unless every family is typed once as a
/// counter, gauge or histogram, every sample follows its family's `# TYPE`, every value is a
/// number, no series repeats, and the text ends with `# EOF`.
pub fn parse(text: &str) -> Samples {
    assert!(text.ends_with("# EOF\n"), "no # EOF at the end:\n{text}");
    let mut types = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| *l != "# EOF") {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect(line);
            assert!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "bad type: {line}"
            );
            let first = types.insert(name.to_string(), kind.to_string()).is_none();
            assert!(first, "family typed twice: {line}");
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(
            !line.is_empty() && !line.starts_with('#'),
            "stray line: {line:?}"
        );
        let (series, value) = line.rsplit_once(' ').expect(line);
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').expect(line)),
            None => (series, ""),
        };
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.contains_key(*f)))
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample before its TYPE: {line}");
        let new = out
            .insert((name.to_string(), labels.to_string()), value)
            .is_none();
        assert!(new, "duplicate series: {line}");
    }
    out
}
