//! The bench's error and result types.

/// Any error; the bench stops at the first one.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The bench's result type.
pub(crate) type Result<T> = std::result::Result<T, BoxError>;
