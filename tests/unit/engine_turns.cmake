# engine_turns_test: the engine's multi-turn turn boundary (park with the KV
# cache, resume with environment tokens, abort, memory pressure, a weight
# commit between turns) on the deterministic toy model.
tandem_add_test(engine_turns_test
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/engine_turns_test.cc
  LIBS tandem_engine)
