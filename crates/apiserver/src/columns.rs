//! The columns of a Table: one column's definition, and a CRD version's `additionalPrinterColumns`.
//! Apart from the table code, so that [`crate::resource`] reads a CRD's columns without depending
//! on the code that prints them (which itself reads resources).

use serde_json::{json, Value};

/// One column definition of a Table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    /// 0 always shown; 1 and more only with `-o wide`.
    pub priority: i64,
}

impl Column {
    pub fn new(name: &str, type_: &str, priority: i64, description: &str) -> Self {
        Self {
            name: name.to_owned(),
            type_: type_.to_owned(),
            format: String::new(),
            description: description.to_owned(),
            priority,
        }
    }

    /// The Name column every table starts with (Events show it last, in the wide form).
    pub fn name() -> Self {
        Self {
            format: "name".to_owned(),
            ..Self::new(
                "Name",
                "string",
                0,
                "Name must be unique within a namespace.",
            )
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({"name": self.name, "type": self.type_, "format": self.format,
            "description": self.description, "priority": self.priority})
    }
}

/// One of a CRD version's `additionalPrinterColumns`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    pub column: Column,
    pub json_path: String,
}

/// The `additionalPrinterColumns` of one CRD version entry; columns without a name or JSONPath
/// are skipped (the apiextensions server would have refused them).
pub fn printer_columns(version: &Value) -> Vec<PrinterColumn> {
    version["additionalPrinterColumns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .filter_map(|c| {
                    let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                    let (name, json_path) = (text("name"), text("jsonPath"));
                    if name.is_empty() || json_path.is_empty() {
                        return None;
                    }
                    Some(PrinterColumn {
                        column: Column {
                            name,
                            type_: text("type"),
                            format: text("format"),
                            description: text("description"),
                            priority: c["priority"].as_i64().unwrap_or_default(),
                        },
                        json_path,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}
