"""The run directory and its files: orbax checkpoints and their averaging (`checkpoints`), what
a checkpoint stores besides arrays (`bookkeeping`), what a resumed run must match
(`resume`), the models a run leaves behind (`final_model`: model/ and averaged/), and the
lock that keeps one trainer per directory (`lock`)."""
