//! `publish`: a stream publish into the channel's sequence, as Herald's
//! own (`centrifugo/publish.rs`).

use std::sync::Arc;

use herald_auth::Principal;
use herald_core::Tags;
use serde_json::value::RawValue;

use super::{channel, Answer};
use crate::centrifugo::codes::{self, ReplyError};
use crate::centrifugo::protocol::{Empty, PublishRequest};
use crate::centrifugo::replies::Reply;
use crate::centrifugo::session::Session;

impl Session {
    /// `publish`: a map publish or removal (type 1, or a key) is not
    /// served (108); another type closes the connection with 3501.
    pub(super) async fn publish_command(&mut self, id: u32, req: PublishRequest) -> Answer {
        match (req.kind, req.key.is_empty() && !req.removed) {
            (0, true) => Answer::of(
                id,
                self.publish(req).await.map(|()| Reply {
                    id,
                    publish: Some(Empty {}),
                    ..Reply::default()
                }),
            ),
            (0 | 1, _) => Answer::error(id, &ReplyError::not_available()),
            _ => Answer::Close(codes::BAD_REQUEST),
        }
    }

    /// Publishes `req.data` to `req.channel`, where the connection may.
    async fn publish(&mut self, req: PublishRequest) -> Result<(), ReplyError> {
        let channel = channel(&req.channel)?;
        let who = self.who.clone().unwrap_or(Principal::Anonymous);
        let auth = self.state.shared.auth();
        if let Err(e) = auth.may_publish(&who, &channel) {
            return Err(self.denied("publish", &who, &channel, &e));
        }
        if auth.take_publishes(&who, 1).is_err() {
            return Err(ReplyError::too_many_requests());
        }
        // JSON text in both forms (checked as the command was decoded).
        let data: Box<RawValue> =
            serde_json::from_slice(&req.data).map_err(|_| ReplyError::bad_request())?;
        let data: Arc<RawValue> = Arc::from(data);
        // Centrifugo's client publish carries no tags.
        crate::centrifugo::publish::publish(&self.state, channel, data, Tags::default(), None)
            .await
            .map(|_| ())
    }
}
