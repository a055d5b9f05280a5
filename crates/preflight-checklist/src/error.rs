//! Checklist errors name the file, line, column and key path, and list the
//! valid choices when there are few.

use std::fmt;

use preflight_ground::yaml::{Location, YamlError};

#[derive(Debug, Clone)]
pub struct ChecklistError {
    pub file: String,
    pub location: Option<Location>,
    /// Key path such as `checks[2].timeout`; empty for the whole file.
    pub path: String,
    pub message: String,
}

impl ChecklistError {
    pub fn from_yaml(file: &str, error: YamlError) -> ChecklistError {
        ChecklistError {
            file: file.to_string(),
            location: error.location,
            path: error.path(),
            message: error.message.clone(),
        }
    }

    /// A file that cannot be read at all.
    pub fn unreadable(file: &str, reason: impl fmt::Display) -> ChecklistError {
        ChecklistError {
            file: file.to_string(),
            location: None,
            path: String::new(),
            message: format!("cannot read: {reason}"),
        }
    }

    /// `source` is the `file:line:column` of the second definition.
    pub fn duplicate(source: &str, id: &str, first: &str) -> ChecklistError {
        let (file, location) = split_source(source);
        ChecklistError {
            file,
            location,
            path: String::new(),
            message: format!("duplicate check id `{id}`: already defined at {first}"),
        }
    }
}

fn split_source(source: &str) -> (String, Option<Location>) {
    let mut parts = source.rsplitn(3, ':');
    let column = parts.next().and_then(|c| c.parse().ok());
    let line = parts.next().and_then(|l| l.parse().ok());
    match (parts.next(), line, column) {
        (Some(file), Some(line), Some(column)) => {
            (file.to_string(), Some(Location { line, column }))
        }
        _ => (source.to_string(), None),
    }
}

impl fmt::Display for ChecklistError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(loc) = self.location {
            write!(f, ":{}:{}", loc.line, loc.column)?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every error found, so one `validate` run shows them all.
#[derive(Debug, Clone)]
pub struct ChecklistErrors(pub Vec<ChecklistError>);

impl fmt::Display for ChecklistErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {e}")?;
        }
        Ok(())
    }
}
