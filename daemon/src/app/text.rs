//! Text for people that more than one caller shows: aligned tables, short commit ids.

/// A plain-text table with aligned columns.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Self {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// Renders with two spaces between columns and `indent` before each line.
    pub fn render(&self, indent: &str) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                if let Some(w) = widths.get_mut(i) {
                    *w = (*w).max(cell.chars().count());
                }
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::from(indent);
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// A commit's id as people see it: its first 12 characters.
pub fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
