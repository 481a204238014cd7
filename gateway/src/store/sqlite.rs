//! placeholder: the SQLite store is being written.
