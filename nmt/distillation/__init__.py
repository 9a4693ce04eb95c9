"""Sequence-level knowledge distillation: a teacher's translations of a corpus, made once and
resumably, for a student to train on (`python -m nmt.distillation`)."""
