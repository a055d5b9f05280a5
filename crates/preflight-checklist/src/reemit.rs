//! A checklist written out again: the property that the loader reads the
//! YAML data, not its spelling. The fuzz target `checklist` and the tests
//! below hold it: a document that loads, re-emitted by saphyr's emitter
//! (block style, its own quoting and indentation), loads to the same
//! checks. Only in test and fuzzing builds.

use super::Check;

/// Each check as data, without where it was written (its `source`).
pub fn canonical(checks: &[Check]) -> Vec<String> {
    checks
        .iter()
        .map(|c| {
            format!(
                "{} kind={} severity={:?} scope={:?} timeout={:?} tags={:?} area={} when={:?} description={:?} hint={:?} opt_in={} params={}",
                c.id,
                c.kind.name,
                c.severity,
                c.scope,
                c.timeout,
                c.tags,
                c.area,
                c.when,
                c.description,
                c.hint,
                c.opt_in,
                c.probe.params()
            )
        })
        .collect()
}

/// The document written out again by saphyr's emitter; `None` where the
/// emitter cannot write it (an alias, several documents), or where saphyr
/// itself reads back other data: that would be the emitter's matter, not
/// the loader's.
pub fn reemit(text: &str) -> Option<String> {
    use saphyr::{LoadableYamlNode, Yaml, YamlEmitter};
    let docs = Yaml::load_from_str(text).ok()?;
    let [doc] = docs.as_slice() else {
        return None;
    };
    let mut out = String::new();
    YamlEmitter::new(&mut out).dump(doc).ok()?;
    let again = Yaml::load_from_str(&out).ok()?;
    (again.as_slice() == docs.as_slice()).then_some(out)
}

/// Loads `text`, and where it loads and re-emits, asserts that the
/// re-emitted text loads to the same checks.
pub fn assert_reemitted_loads_the_same(file: &str, text: &str) {
    let Ok(first) = super::load_text(file, text) else {
        return;
    };
    let Some(out) = reemit(text) else {
        return;
    };
    let again = super::load_text(file, &out)
        .unwrap_or_else(|e| panic!("re-emitted, the checklist no longer loads: {e}\n{out}"));
    assert_eq!(canonical(&first), canonical(&again), "re-emitted:\n{out}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_checklist_reemitted_loads_the_same_checks() {
        let shipped = super::super::shipped();
        assert!(!shipped.is_empty());
        for source in shipped {
            assert!(
                reemit(&source.text).is_some(),
                "{}: saphyr cannot re-emit it",
                source.name
            );
            assert_reemitted_loads_the_same(&source.name, &source.text);
        }
    }

    #[test]
    fn flow_style_and_aliases_load_as_their_block_spelling() {
        let text = "checks:\n  - {id: a.one, kind: command, area: system, argv: &argv [\"true\"], tags: [x]}\n  - id: a.two\n    kind: command\n    area: system\n    argv: *argv\n    severity: warn\n    when: {backend: nccl}\n";
        let loaded = super::super::load_text("t.yaml", text).expect("loads");
        assert_eq!(loaded.len(), 2);
        // Aliases cannot be re-emitted: the emitter gives up, and the
        // property is not asked of this text.
        if reemit(text).is_some() {
            assert_reemitted_loads_the_same("t.yaml", text);
        }
        let plain = "checks:\n  - {id: a.one, kind: command, area: system, argv: [\"true\"], severity: warn, timeout: 3s, tags: [x, 'y z']}\n";
        assert!(reemit(plain).is_some());
        assert_reemitted_loads_the_same("t.yaml", plain);
    }
}
