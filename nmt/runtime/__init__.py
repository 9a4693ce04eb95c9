"""Process plumbing shared by the commands: one-line errors and exit statuses (`cli`), files
written whole or not at all (`files`), several processes (`distributed`), JAX's persistent
compilation cache and the compile record (`compilation`), the malloc the commands run on
(`allocator`). Imports nothing else of `nmt`."""
