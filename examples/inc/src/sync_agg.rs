//! Synchronous aggregation — user code. Each worker contributes its
//! gradient for a step and trains on the sum over all workers; the data
//! plane adds the gradients and sends every worker the sum (NetFilter:
//! `Map.addTo` + `CntFwd` to the members).

use protoplane_inc::keys::Quantizer;
use protoplane_inc_net::agent::ClientRuntime;

/// The filter's `Precision`: decimal digits kept of each float.
pub const PRECISION: u32 = 6;

/// Runs one worker over its gradients (one per step) and returns the
/// summed gradient of every step.
pub fn worker(rt: &mut ClientRuntime, steps: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, String> {
    let q = Quantizer::new(PRECISION);
    let mut sums = Vec::with_capacity(steps.len());
    for gradient in steps {
        let mine = gradient
            .iter()
            .map(|g| {
                q.quantize(*g)
                    .ok()
                    .and_then(|v| i32::try_from(v).ok())
                    .ok_or(format!("{g} out of range"))
            })
            .collect::<Result<Vec<i32>, String>>()?;
        let total = rt.aggregate(&mine)?;
        sums.push(total.into_iter().map(|s| q.dequantize(s)).collect());
    }
    Ok(sums)
}
