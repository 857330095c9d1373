//! Synchronous aggregation — user code. Each worker sends its gradient of
//! a step and trains on the sum over all workers: an ordinary unary call of
//! `Trainer.Aggregate`. The NetFilter (`Map.addTo` + `CntFwd` to the
//! members) makes the data plane add the gradients and send every worker
//! the sum; the server sees the step number only.

use protoplane_grpc::{Code, Message, Request, Status};
use protoplane_wire::Block;

use crate::generated::protoplane::examples::syncagg::trainer_inc_client::TrainerIncClient;
use crate::generated::protoplane::examples::syncagg::trainer_server::Trainer;
use crate::generated::protoplane::examples::syncagg::{
    GradientReply, GradientReplyBuilder, GradientReplyView, GradientRequest,
    GradientRequestBuilder, GradientRequestView,
};

/// The server: it answers with the step; the gradient field of the reply
/// is the network's.
#[derive(Debug, Default)]
pub struct TrainerService;

impl Trainer for TrainerService {
    async fn aggregate(&self, request: Request<Message>) -> Result<Block, Status> {
        let req: GradientRequestView<'_> = request.message.typed()?;
        let mut b = GradientReply::builder();
        GradientReplyBuilder::root(&mut b).set_step(req.step());
        Ok(b.finish())
    }
}

/// Runs one worker over its gradients (one per step, numbered from
/// `first_step`) and returns the summed gradient of every step, with the
/// workers it sums (a bit each; 0: every worker — fewer only when the
/// NetFilter's `MemberLoss` is `continue` and a worker was lost).
pub async fn worker(
    client: &TrainerIncClient,
    first_step: u32,
    steps: &[Vec<f64>],
) -> Result<Vec<(Vec<f64>, u64)>, Status> {
    let mut sums = Vec::with_capacity(steps.len());
    for (step, gradient) in (first_step..).zip(steps) {
        let mut b = GradientRequest::builder();
        let mut req = GradientRequestBuilder::root(&mut b);
        req.set_step(step);
        req.gradient()?.extend_values(gradient.iter().copied())?;
        let reply = client.aggregate(Request::new(&b.finish())).await?;
        let reply: GradientReplyView<'_> = reply.typed()?;
        if reply.step() != step {
            return Err(Status::new(
                Code::Internal,
                format!("step {step} answered as {}", reply.step()),
            ));
        }
        sums.push(reply.gradient().map(|g| (g.values().to_vec(), g.members())).unwrap_or_default());
    }
    Ok(sums)
}
