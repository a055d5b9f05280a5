//! "Did you mean": the closest known name to a misspelt one.

/// The candidate nearest to `word`, if it is close enough to be a typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word_lower = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| {
            (
                strsim::damerau_levenshtein(&word_lower, &c.to_ascii_lowercase()),
                c,
            )
        })
        .filter(|(distance, c)| *distance > 0 && *distance <= typo_budget(c.len().max(word.len())))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

fn typo_budget(len: usize) -> usize {
    match len {
        0..=3 => 1,
        4..=8 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_close_names_only() {
        let kinds = ["command", "file", "kernel_param", "env"];
        assert_eq!(did_you_mean("commnd", kinds), Some("command"));
        assert_eq!(did_you_mean("kernel-param", kinds), Some("kernel_param"));
        assert_eq!(did_you_mean("zzzzzz", kinds), None);
        assert_eq!(did_you_mean("command", kinds), None);
    }
}
