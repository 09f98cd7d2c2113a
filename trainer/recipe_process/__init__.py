"""What runs inside the recipe process(es) around torchtune's unmodified recipe: ``bootstrap``
(what the launcher starts instead of the recipe script), ``recipe_hooks`` (the recipe
class's setup, data and saves wrapped), ``cpu_adapt`` (gloo and no CUDA calls on CPU),
``document_attention`` (a packed batch on CPU attends per document, not over its whole
pack), ``chunked_output`` (a chunked loss's output projection on CPU one matrix product per
chunk, never a copy of the output weight per sequence), ``save_progress`` (a checkpoint
save's progress line: the bytes written so far), ``step_guard`` (stop on SIGTERM with a resumable save, exact resume; a non-finite
loss stops the run), ``run_sanity`` (no optimizer step, no row to train on or non-finite
weights: nothing is saved, one line, exit 65), ``fallbacks`` (torch.compile that fails ->
eager; out of memory at the first step -> a smaller micro-batch, same effective batch),
``failure_report`` (a refused run, no fallback left or out of memory, found by type even
when wrapped, left for the launcher as a failure record: its line and exit code),
``tokenized_data`` (the recipe's datasets tokenized once through the token cache),
``held_out`` (the held-out set measured at step boundaries, recorded; early stop; what each
evaluation measures by objective: ``held_out_measure``), ``data_counts`` (the rows each
dataset read, dropped, held out and kept, logged and recorded), ``few_steps`` (a line before
step 1 where the data makes few optimizer steps),
``dataset_features`` (a config's ``dataset.features`` dict made datasets' ``Features``),
``empty_batches`` (a micro-batch with nothing to train on adds nothing to its step, instead
of NaN), ``warmup_cap`` (a warm-up the user did not set capped to a tenth of the run's
steps), ``sample_capture`` (a few training samples as the tokenizer made them, for the
exporter's chat-template check), ``recipe_noise`` (torchtune's dumps kept at debug). What
torchrun and the launcher tell this process through its environment (rank, processes on the
node, stop file, failure record directory, compile backend, test hooks) is read in
``request.passed_env`` (the data, checkpointing and metric_logging rooms read it too, and
they sit below this one)."""
