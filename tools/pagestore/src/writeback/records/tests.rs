//! Tests of the record table.
