//! The body of a `PUT` or `POST`, read whole up to
//! `durable_streams.max_append_bytes`; a longer one is refused with
//! Herald's JSON error, 413 `payload_too_large`, before anything is
//! written.

use axum::extract::{FromRequest, Request};
use bytes::Bytes;

use crate::state::StreamsState;
use herald_http::error::Error;

/// The request body, at most `durable_streams.max_append_bytes` long.
#[derive(Debug)]
pub(crate) struct AppendBody(pub(crate) Bytes);

impl FromRequest<StreamsState> for AppendBody {
    type Rejection = Error;

    async fn from_request(request: Request, state: &StreamsState) -> Result<Self, Error> {
        let limit = state.config.max_append_bytes;
        Bytes::from_request(request, state)
            .await
            .map(Self)
            .map_err(|rejection| {
                if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    Error::PayloadTooLarge { limit }
                } else {
                    Error::InvalidStreamRequest(format!("the body could not be read: {rejection}"))
                }
            })
    }
}
