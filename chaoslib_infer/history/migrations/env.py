"""Alembic environment of the history store: runs the migrations on the connection that
:func:`chaoslib_infer.history.store.open_store` hands over (``config.attributes["connection"]``)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
