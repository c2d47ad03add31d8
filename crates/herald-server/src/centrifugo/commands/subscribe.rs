//! `subscribe`: a client-side subscription, and what every subscription
//! shares with the server-side ones of `connect`: its start (presence row,
//! epoch, recovery, the live subscription and its task, joins and leaves).

use std::sync::Arc;

use herald_auth::Principal;
use herald_core::{ChannelName, Message, Offset};
use herald_node::node_error::StorageContext;
use herald_node::subscription::{StartAt, Subscription};
use herald_storage::PresenceEventKind;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::follow::{follow, Follow};
use super::{channel, expiry_instant, Answer, Expiry};
use crate::centrifugo::channel_options::ChannelOptions;
use crate::centrifugo::codes::{self, ReplyError};
use crate::centrifugo::fossil_delta::FossilDelta;
use crate::centrifugo::history::Budget;
use crate::centrifugo::presence;
use crate::centrifugo::protocol::{SubscribeRequest, SUBSCRIPTION_FLAG_REJECT_UNRECOVERED};
use crate::centrifugo::recovery::{self, Recovery};
use crate::centrifugo::replies::{one_line, DataForm, Publication, Reply, SubscribeResult};
use crate::centrifugo::session::{Session, Sub};
use crate::centrifugo::tags_filter::FilterNode;

/// A subscription as it started: what its subscribe result reports.
pub(super) struct Started {
    /// The channel's epoch.
    epoch: String,
    /// Live publications continue after this offset.
    position: Offset,
    /// Every publication after the client's offset, when recovered.
    pub(super) missed: Vec<Message>,
    /// A recovery was asked for and succeeded.
    recovered: bool,
    /// A recovery was asked for.
    was_recovering: bool,
    /// How the publications' `data` is written (a delta subscription's
    /// whole form).
    form: DataForm<'static>,
    /// Delta is on for the subscription.
    delta: bool,
}

impl Started {
    /// The subscribe result, with `expiry` and `data` (a server-side
    /// subscription's, from the token's `subs` claim).
    pub(super) fn result(&self, expiry: &Expiry, data: Option<&RawValue>) -> SubscribeResult {
        let data = data.map(|d| one_line(d).get().as_bytes().to_vec());
        SubscribeResult {
            expires: expiry.expires,
            ttl: expiry.ttl(),
            recoverable: true,
            positioned: true,
            epoch: self.epoch.clone(),
            offset: self.position,
            publications: self
                .missed
                .iter()
                .map(|m| Publication::with_form(m, self.form))
                .collect(),
            recovered: self.recovered,
            was_recovering: self.was_recovering,
            delta: self.delta,
            data: data.unwrap_or_default(),
        }
    }
}

/// Where a client asks to recover from: the epoch and offset it saw, and
/// the history resume window when it may not read the channel's history
/// (`recovery.rs`).
pub(super) struct RecoverFrom<'a> {
    pub(super) epoch: &'a str,
    pub(super) offset: Offset,
    pub(super) live_only: Option<std::time::Duration>,
    /// Answer 112 instead of `recovered: false`
    /// ([`SUBSCRIPTION_FLAG_REJECT_UNRECOVERED`]).
    pub(super) reject_unrecovered: bool,
}

/// What a `subscribe` asks for that a stream subscription of Herald does
/// not serve, refused as Centrifugo refuses it where it is not set up:
/// no channel, a type other than stream, a map's paging fields, an
/// unknown delta type or a malformed tags filter close the connection
/// with 3501; a map (types 1–3) or shared poll (4) subscription is
/// answered 108 "not available". `None`: the request is served.
fn unserved_subscribe(id: u32, req: &SubscribeRequest) -> Option<Answer> {
    if req.channel.is_empty() {
        return Some(Answer::Close(codes::BAD_REQUEST));
    }
    match req.kind {
        0 => {}
        1..=4 => return Some(Answer::error(id, &ReplyError::not_available())),
        _ => return Some(Answer::Close(codes::BAD_REQUEST)),
    }
    let map_fields = req.phase != 0 || !req.cursor.is_empty() || req.limit != 0 || req.asc;
    let delta_known = matches!(req.delta.as_str(), "" | "fossil");
    let filter_valid = req.tf.as_ref().is_none_or(|tf| tf.validate().is_ok());
    (map_fields || !delta_known || !filter_valid).then_some(Answer::Close(codes::BAD_REQUEST))
}

/// The join and leave part of a new subscription.
#[derive(Default)]
pub(super) struct JoinLeave {
    /// The subscribe request asked for join and leave pushes
    /// (`join_leave`).
    asked: bool,
    /// The subscription token's `info`, announced as `chan_info`.
    chan_info: Option<String>,
}

impl Session {
    /// `subscribe`: a client-side subscription to `req.channel`.
    pub(super) async fn subscribe(&mut self, id: u32, req: SubscribeRequest) -> Answer {
        if let Some(refused) = unserved_subscribe(id, &req) {
            return refused;
        }
        let channel = match channel(&req.channel) {
            Ok(channel) => channel,
            Err(e) => return Answer::error(id, &e),
        };
        if self.subs.contains_key(&channel) {
            return Answer::error(id, &ReplyError::already_subscribed());
        }
        // Centrifugo checks its channel limit after "already subscribed"
        // and before the token: 106, nothing started.
        if self.subs.len() >= self.state.config().channel_limit {
            return Answer::error(id, &ReplyError::limit_exceeded());
        }
        let (who, sub_token) = if req.token.is_empty() {
            (self.who.clone().unwrap_or(Principal::Anonymous), false)
        } else {
            match self.check_token(id, &req.token).await {
                Ok(who) => (who, true),
                Err(answer) => return answer,
            }
        };
        if let Err(e) = self.state.shared.auth().may_subscribe(&who, &channel) {
            return Answer::error(id, &self.denied("subscribe", &who, &channel, &e));
        }
        let (expiry, expires) = if sub_token {
            (Expiry::of(&who), expiry_instant(&who))
        } else {
            (Expiry::NONE, None)
        };
        let join_leave = JoinLeave {
            asked: req.join_leave,
            chan_info: if sub_token {
                who.token().and_then(|t| t.info.clone())
            } else {
                None
            },
        };
        let recover = req.recover.then_some(RecoverFrom {
            epoch: &req.epoch,
            offset: req.offset,
            live_only: self.state.shared.auth().live_only_window(&who, &channel),
            reject_unrecovered: req.flag & SUBSCRIPTION_FLAG_REJECT_UNRECOVERED != 0,
        });
        let budget = Budget::of(self.state.settings());
        let filter = req.tf.map(Arc::new);
        let delta = (req.delta == "fossil"
            && ChannelOptions::of(&self.state, &channel).fossil_delta)
            .then(|| FossilDelta::new(self.encoding, &self.state.centrifugo.deltas, &channel));
        let follow = Follow { filter, delta };
        match self
            .start_subscription(&channel, recover, expires, join_leave, budget, follow)
            .await
        {
            Ok(started) => Answer::reply(Reply {
                id,
                subscribe: Some(started.result(&expiry, None)),
                ..Reply::default()
            }),
            Err(e) => Answer::error(id, &e),
        }
    }

    /// Starts this connection's subscription to `channel` (its rights were
    /// checked): its presence row, the channel's epoch, the recovery from
    /// `recover` if asked (see `recovery.rs`), then the live
    /// [`Subscription`] after the last publication handed out, followed by
    /// a task that queues its pushes. `expires` is when a subscription
    /// token ends it. Where the channel's namespace has `join_leave`, its
    /// join is announced, and the connection gets the channel's join and
    /// leave pushes (its own join first, after the reply) when it asked for
    /// them or the namespace forces them. With a tags `filter`, only the
    /// publications it passes are recovered and pushed (the others are
    /// skipped, their offsets included). On failure nothing of it is left.
    ///
    /// # Errors
    /// 100 (logged) when the storage fails; 112 when a recovery that
    /// asked to reject an unrecovered position fails.
    pub(super) async fn start_subscription(
        &mut self,
        channel: &ChannelName,
        recover: Option<RecoverFrom<'_>>,
        expires: Option<Instant>,
        join_leave: JoinLeave,
        budget: Budget,
        how: Follow,
    ) -> Result<Started, ReplyError> {
        let Follow { filter, delta } = how;
        let options = ChannelOptions::of(&self.state, channel);
        presence::join(&self.state, &self.client, &self.user(), channel).await?;
        let started = self
            .follow_channel(channel, recover.as_ref(), budget, filter.as_deref())
            .await;
        let (mut started, live) = match started {
            Ok(Some(started)) => started,
            Ok(None) => {
                presence::remove(&self.state, &self.client, channel).await;
                return Err(ReplyError::unrecoverable_position());
            }
            Err(e) => {
                e.log();
                // The row goes before the answer: a refused subscribe
                // leaves nothing behind when it is answered.
                presence::remove(&self.state, &self.client, channel).await;
                return Err(ReplyError::internal());
            }
        };
        self.generations += 1;
        let generation = self.generations;
        if let Some(delta) = &delta {
            started.form = delta.whole();
            started.delta = true;
        }
        let task = tokio::spawn(follow(
            live,
            generation,
            self.out.clone(),
            Follow { filter, delta },
            self.encoding,
            Arc::clone(&self.queue),
        ));
        self.subs.insert(
            channel.clone(),
            Sub {
                generation,
                task,
                expires,
                join_leave: options.join_leave,
                chan_info: join_leave.chan_info.clone(),
            },
        );
        let registry = &self.state.centrifugo.registry;
        registry.set_subscribed(&self.client, channel, true);
        // Listening first: a subscriber that asked gets its own join,
        // after the reply (the session writes the reply before it reads
        // its push queue again), as Centrifugo's subscribers do.
        let pushes = &registry.join_leave;
        if options.pushes_join_leave(join_leave.asked) {
            pushes.listen(
                channel,
                &self.client,
                generation,
                self.out.clone(),
                self.encoding,
            );
        }
        if options.join_leave {
            pushes.emit(self.presence_event(
                PresenceEventKind::Join,
                channel.clone(),
                join_leave.chan_info,
            ));
        }
        Ok(started)
    }

    /// The storage's part of [`Session::start_subscription`]: the epoch,
    /// the recovery (only the publications `filter` passes), and the live
    /// subscription after its last publication; `None` when the recovery
    /// failed and was asked to be rejected.
    async fn follow_channel(
        &self,
        channel: &ChannelName,
        recover: Option<&RecoverFrom<'_>>,
        budget: Budget,
        filter: Option<&FilterNode>,
    ) -> herald_http::error::Result<Option<(Started, Subscription)>> {
        let shared = &self.state.shared;
        let storage = shared.node.storage().as_ref();
        let epoch = storage
            .channel_epoch(channel)
            .await
            .during("channel_epoch", Some(channel))?;
        let recovery = match recover {
            Some(from) => {
                recovery::recover(
                    storage,
                    channel,
                    &epoch,
                    from.epoch,
                    from.offset,
                    from.live_only,
                    budget,
                )
                .await?
            }
            None => {
                let page = storage
                    .read(channel, Offset::MAX, 1)
                    .await
                    .during("read", Some(channel))?;
                Recovery::NotRecovered {
                    position: page.head,
                }
            }
        };
        let (mut missed, position, recovered) = match recovery {
            Recovery::Recovered {
                publications,
                position,
            } => (publications, position, true),
            Recovery::NotRecovered { .. } if recover.is_some_and(|r| r.reject_unrecovered) => {
                return Ok(None);
            }
            Recovery::NotRecovered { position } => (Vec::new(), position, false),
        };
        if let Some(filter) = filter {
            missed.retain(|m| filter.matches(&m.tags));
        }
        let live = Subscription::start_paged(
            Arc::clone(shared.node.storage()),
            shared.node.hub(),
            channel.clone(),
            StartAt::After(position),
            "centrifugo",
            shared.settings.read_page_messages(),
        )
        .await?;
        let started = Started {
            epoch,
            position,
            missed,
            recovered,
            was_recovering: recover.is_some(),
            form: DataForm::Plain,
            delta: false,
        };
        Ok(Some((started, live)))
    }
}
