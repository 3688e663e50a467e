//! The conversion between `v1alpha1` and `v1` Pets, as pure functions on
//! the JSON the API server sends the webhook. Lossless both ways:
//! `v1alpha1 -> v1 -> v1alpha1` and `v1 -> v1alpha1 -> v1` give back the
//! identical object.
//!
//! Only two things change: `apiVersion`, and `spec.birthday`, a timestamp in
//! v1alpha1 and a calendar date in v1. The date is the timestamp's own,
//! in its own offset (what the store has always kept). What a date cannot
//! hold, the timestamp exactly as written, travels in the annotation
//! [`V1ALPHA1_BIRTHDAY_ANNOTATION`] (the Kubernetes API convention for
//! fields a version cannot represent). It is written only when the
//! timestamp is not the date's midnight UTC (`2021-04-01T00:00:00Z`), and
//! is ignored and dropped once it names another date than the v1 one (the
//! date was changed through v1). Everything else, unknown fields included,
//! passes through untouched: the objects are never re-serialised from
//! Rust types, which would normalise strings.

use chrono::{DateTime, FixedOffset, NaiveDate};
use serde_json::{Map, Value};

/// `apiVersion` of the storage version.
pub const V1: &str = "petstore.example.com/v1";
/// `apiVersion` of the deprecated version.
pub const V1ALPHA1: &str = "petstore.example.com/v1alpha1";
/// On a v1 Pet: the v1alpha1 `spec.birthday` exactly as written, when the
/// date alone would not give it back.
pub const V1ALPHA1_BIRTHDAY_ANNOTATION: &str = "petstore.example.com/v1alpha1-birthday";

/// Why an object cannot be converted. The message reaches the user through
/// the API server, so it names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    #[error("cannot convert to {0:?}: this webhook serves {V1} and {V1ALPHA1}")]
    UnknownTargetVersion(String),
    #[error("not a Pet of {V1} or {V1ALPHA1} (apiVersion {api_version:?}, kind {kind:?})")]
    NotAPet { api_version: String, kind: String },
    #[error("spec.birthday is not a string: {0}")]
    BirthdayNotAString(Value),
    #[error("spec.birthday {0:?} is not an RFC 3339 timestamp such as 2021-04-01T00:00:00Z")]
    BadTimestamp(String),
    #[error("spec.birthday {0:?} is not a date such as 2021-04-01")]
    BadDate(String),
}

/// Converts one object (a Pet of either version) to `desired_api_version`.
pub fn convert(mut object: Value, desired_api_version: &str) -> Result<Value, ConversionError> {
    if desired_api_version != V1 && desired_api_version != V1ALPHA1 {
        return Err(ConversionError::UnknownTargetVersion(
            desired_api_version.to_owned(),
        ));
    }
    let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
    let Some(fields) = object.as_object_mut() else {
        return Err(ConversionError::NotAPet {
            api_version,
            kind: String::new(),
        });
    };
    let kind = fields
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if kind != "Pet" || (api_version != V1 && api_version != V1ALPHA1) {
        return Err(ConversionError::NotAPet {
            api_version,
            kind: kind.to_owned(),
        });
    }
    if api_version == desired_api_version {
        return Ok(object);
    }
    if desired_api_version == V1 {
        to_v1(fields)?;
    } else {
        to_v1alpha1(fields)?;
    }
    fields.insert("apiVersion".into(), desired_api_version.into());
    Ok(object)
}

/// The v1alpha1 timestamp that stands for a v1 date when nothing else was
/// written: its midnight UTC, as the book's samples write birthdays.
pub fn midnight_utc(date: NaiveDate) -> String {
    format!("{date}T00:00:00Z")
}

/// Reads a v1alpha1 birthday with the parser the operator read v1alpha1
/// with (chrono's), so every Pet an older operator accepted converts.
pub fn parse_timestamp(text: &str) -> Option<DateTime<FixedOffset>> {
    text.parse().ok()
}

/// Reads a v1 birthday: `YYYY-MM-DD` exactly, as the schema's `format: date`.
pub fn parse_date(text: &str) -> Option<NaiveDate> {
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .filter(|date| date.to_string() == text)
}

fn to_v1(fields: &mut Map<String, Value>) -> Result<(), ConversionError> {
    let Some(written) = birthday(fields)? else {
        return Ok(());
    };
    let timestamp =
        parse_timestamp(&written).ok_or_else(|| ConversionError::BadTimestamp(written.clone()))?;
    let date = timestamp.date_naive();
    set_birthday(fields, date.to_string());
    if written == midnight_utc(date) {
        remove_annotation(fields);
    } else {
        set_annotation(fields, written);
    }
    Ok(())
}

fn to_v1alpha1(fields: &mut Map<String, Value>) -> Result<(), ConversionError> {
    let Some(written) = birthday(fields)? else {
        return Ok(());
    };
    let date = parse_date(&written).ok_or_else(|| ConversionError::BadDate(written.clone()))?;
    let timestamp = remove_annotation(fields)
        .filter(|kept| parse_timestamp(kept).is_some_and(|t| t.date_naive() == date))
        .unwrap_or_else(|| midnight_utc(date));
    set_birthday(fields, timestamp);
    Ok(())
}

/// `spec.birthday`, if the object has one. A Pet without one (which the
/// schema refuses) still converts: there is nothing to lose.
fn birthday(fields: &Map<String, Value>) -> Result<Option<String>, ConversionError> {
    match fields.get("spec").and_then(|spec| spec.get("birthday")) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(ConversionError::BirthdayNotAString(other.clone())),
    }
}

fn set_birthday(fields: &mut Map<String, Value>, birthday: String) {
    if let Some(spec) = fields.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("birthday".into(), birthday.into());
    }
}

fn set_annotation(fields: &mut Map<String, Value>, value: String) {
    let metadata = fields
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(annotations) = annotations.as_object_mut() {
        annotations.insert(V1ALPHA1_BIRTHDAY_ANNOTATION.into(), value.into());
    }
}

/// Removes the annotation and returns its value. An emptied `annotations`
/// goes too: the API server never sends an empty one, so a round trip that
/// added the annotation and took it away again leaves the object as it was.
fn remove_annotation(fields: &mut Map<String, Value>) -> Option<String> {
    let metadata = fields.get_mut("metadata")?.as_object_mut()?;
    let annotations = metadata.get_mut("annotations")?.as_object_mut()?;
    let removed = annotations.remove(V1ALPHA1_BIRTHDAY_ANNOTATION)?;
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    match removed {
        Value::String(text) => Some(text),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
