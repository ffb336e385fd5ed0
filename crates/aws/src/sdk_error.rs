//! What an AWS SDK call's error means to berth, for every SDK client it uses (ELBv2 and EC2):
//! the error codes both services share sorted into [`ApiErrorKind`]s.

use aws_sdk_elasticloadbalancingv2::error::{ProvideErrorMetadata, SdkError};

use crate::elbv2::{ApiError, ApiErrorKind};

/// Sorts an SDK error by its code into the kinds the provider acts on.
pub(crate) fn api_error<E: ProvideErrorMetadata + std::fmt::Debug, R: std::fmt::Debug>(
    operation: &'static str,
    e: SdkError<E, R>,
) -> ApiError {
    let (kind, code, message) = match &e {
        SdkError::ServiceError(s) => {
            let code = s.err().code().unwrap_or("Unknown").to_string();
            let message = s.err().message().unwrap_or_default().to_string();
            let kind = if code.ends_with("NotFound")
                || code == "InvalidTarget" && message.contains("does not exist")
            {
                ApiErrorKind::NotFound
            } else if code.starts_with("Throttl")
                || code == "RequestLimitExceeded"
                || code == "TooManyRequestsException"
            {
                ApiErrorKind::Throttled
            } else if code == "ResourceInUse" {
                ApiErrorKind::InUse
            } else if code.starts_with("Duplicate") {
                ApiErrorKind::Duplicate
            } else if code.contains("InternalFailure") || code.contains("ServiceUnavailable") {
                ApiErrorKind::Transient
            } else {
                ApiErrorKind::Invalid
            };
            (kind, code, message)
        }
        other => (
            ApiErrorKind::Transient,
            "Transport".to_string(),
            format!("{other:?}"),
        ),
    };
    ApiError {
        operation,
        kind,
        code,
        message,
    }
}
