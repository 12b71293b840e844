//! The plugin author's crate for sharehost.
//!
//! Placeholder until the plugin contract lands: the WIT world, the pure `Record`/`Verdict`
//! types and the export macro arrive with the plugin-runtime issue. It exists now so the
//! workspace layout is the one plugin authors will see.
