//! Reads a step late: a step's loss and correct count left on the device
//! (`Backend::loss_and_accuracy_on_device`), a gate that the optimiser kernels read there
//! instead of the host reading the gradients' finiteness (`Backend::mark_non_finite`), and
//! reads started into page-locked memory behind the queued work and finished later
//! (`Backend::read_later`, `Backend::finish_read`). With them the training loop queues step
//! `k + 1` before it reads step `k`'s figures, so the device never drains between steps.

use super::kernels::launch;
use super::{device_error, CudaBackend, CudaTensor};
use cudarc::driver::{result, CudaEvent, CudaSlice, DevicePtr, PinnedHostSlice};
use fanout_compute::{Backend, DeviceResult, PendingRead, Result, StepFigures, Tensor};

/// A read under way: the page-locked buffer it lands in, the event after the copy, and the
/// tensor's shape. Dropped unfinished (a run ending with an error while a step is queued), it
/// waits for the copy before its buffer is freed.
struct CudaRead {
    buf: Option<PinnedHostSlice<f32>>,
    done: CudaEvent,
    rows: usize,
    cols: usize,
}

impl Drop for CudaRead {
    fn drop(&mut self) {
        if self.buf.is_some() {
            let _ = self.done.synchronize();
        }
    }
}

/// Page-locked buffers of finished reads, kept for the next ones (a step starts two).
#[derive(Default)]
pub(crate) struct ReadBuffers(std::sync::Mutex<Vec<PinnedHostSlice<f32>>>);

impl CudaBackend {
    /// The gate of ungated optimiser steps: one zero on the device, made once.
    pub(super) fn open_gate(&self) -> DeviceResult<&CudaSlice<f32>> {
        if let Some(g) = self.inner.open_gate.get() {
            return Ok(g);
        }
        let g = self.alloc::<f32>(1)?;
        Ok(self.inner.open_gate.get_or_init(|| g))
    }

    /// See `Backend::loss_and_accuracy_on_device`: the kernels of `loss_and_accuracy`, the
    /// figures written as floats where it reads them back.
    pub(super) fn figures_on_device(
        &self,
        logits: &CudaTensor,
        labels: &[i64],
    ) -> Result<StepFigures<CudaTensor>> {
        let rows = logits.rows;
        if rows >= 1 << 24 {
            // The count would not be exact as a float: read it as `loss_and_accuracy` does.
            let (ce, correct) = self.loss_and_accuracy(logits, labels)?;
            return Ok(StepFigures {
                figures: self.upload(&Tensor::new(1, 2, vec![ce.loss, correct as f32]))?,
                count: ce.count,
                grad: ce.grad,
            });
        }
        let (count, grad, per_row) = self.loss_and_hits(logits, labels)?;
        // No row labelled: no loss, no hit (the zeros).
        let mut figures = self.new_tensor(1, 2)?;
        if let Some((row_loss, hit)) = per_row {
            let (r64, c64) = (rows as i64, count as i64);
            launch!(
                self.inner,
                "step_figures_f32",
                1,
                [&row_loss, &hit, &r64, &c64, &mut figures.data]
            );
        }
        Ok(StepFigures {
            figures,
            count,
            grad,
        })
    }

    /// See `Backend::mark_non_finite`.
    pub(super) fn mark_gate(
        &self,
        x: &CudaTensor,
        gate: &mut CudaTensor,
        slot: usize,
    ) -> DeviceResult<()> {
        assert!(
            gate.rows == 1 && slot + 1 < gate.cols,
            "mark_non_finite: slot {slot} outside the gate"
        );
        let (n, slot) = (x.len() as i64, slot as i64);
        launch!(
            self.inner,
            "mark_non_finite",
            x.len(),
            [&x.data, &n, &mut gate.data, &slot]
        );
        Ok(())
    }

    /// See `Backend::read_later`: a copy into a page-locked buffer queued behind the work
    /// before it, and an event after it. Without page-locked memory it reads at once.
    pub(super) fn start_read(&self, t: &CudaTensor) -> DeviceResult<PendingRead> {
        let n = t.len();
        let stream = self.stream();
        let kept = {
            let mut free = self.inner.reads.0.lock().unwrap_or_else(|p| p.into_inner());
            free.iter()
                .position(|b| b.len() >= n)
                .map(|i| free.swap_remove(i))
        };
        // SAFETY: only the first `n` values are read, after the copy below wrote them. Not
        // write-combined (`alloc_pinned`'s default): the host reads these.
        let buf = kept.or_else(|| unsafe {
            stream
                .context()
                .alloc_pinned_with_flags::<f32>(n.max(1).next_power_of_two(), 0)
                .ok()
        });
        let Some(mut buf) = buf else {
            return Ok(PendingRead::done(self.tensor_to_host(t)?));
        };
        if n > 0 {
            let dst = match buf.as_mut_slice() {
                Ok(d) => &mut d[..n],
                Err(_) => return Ok(PendingRead::done(self.tensor_to_host(t)?)),
            };
            let (src, record) = t.data.device_ptr(stream);
            // SAFETY: `dst` holds `n` floats and is not read or written until the event
            // recorded below has completed (`end_read`); `src` holds at least `n`.
            unsafe { result::memcpy_dtoh_async(dst, src, stream.cu_stream()) }
                .map_err(|e| device_error("cuMemcpyDtoHAsync", e))?;
            drop(record);
        }
        let done = stream
            .record_event(None)
            .map_err(|e| device_error("cuEventRecord", e))?;
        Ok(PendingRead::started(Box::new(CudaRead {
            buf: Some(buf),
            done,
            rows: t.rows,
            cols: t.cols,
        })))
    }

    /// See `Backend::finish_read`: waits for the copy's event and returns the buffer to the
    /// free list.
    pub(super) fn end_read(&self, read: PendingRead) -> DeviceResult<Tensor> {
        let rec = match read.into_inner() {
            Ok(t) => return Ok(t),
            Err(rec) => rec,
        };
        let Ok(r) = rec.downcast::<CudaRead>() else {
            panic!("finish_read: a read the CUDA backend did not start")
        };
        let mut r = *r;
        r.done
            .synchronize()
            .map_err(|e| device_error("cuEventSynchronize", e))?;
        let (rows, cols) = (r.rows, r.cols);
        let mut buf = r.buf.take().expect("a started read holds its buffer");
        let n = rows * cols;
        let values = match buf.as_mut_slice() {
            Ok(s) => s[..n].to_vec(),
            Err(e) => return Err(device_error("page-locked read", e)),
        };
        let mut free = self.inner.reads.0.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() < 8 {
            free.push(buf);
        }
        Ok(Tensor::new(rows, cols, values))
    }
}
