"""Training objectives beyond imitation, each a module of its own on the same rails as
SFT (the launcher, the step guard, the reports, the exporter):

- ``dpo``: preference tuning; torchtune's DPO recipe and config for a method on a
  topology, the preference builder chosen for the data, the recipes' quirks the
  launcher corrects;
- ``preference_rows``: preference rows in the shapes users have (TRL's standard,
  conversational and implicit-prompt, torchtune's, HH-RLHF's) read as a prompt and two
  answers, without torch;
- ``preference_data``: the builder a DPO config's ``dataset`` names
  (``_component_: kubetune.trainer.objectives.preference_data.preference_dataset``);
- ``distill``: knowledge distillation; torchtune's KD recipe and config for a method on
  a topology, the teacher (named, else the workspace's ``teacher/``) fitted and checked
  against the student's vocabulary, the methods no KD recipe runs refused;
- ``dpo_held_out``: a DPO run's held-out set fitted to the preference builder (measured in
  the recipe process by ``validation.preference_held_out``);
- ``choice``: the objective a run asks for (``--objective``) -> recipe and config; each
  objective is one entry there and a module here.

Imported by ``planning`` (the recipe, the builder, the teacher) and, by ``_component_`` path, by
the recipe process.
"""
