// The source of target dtrain_test_pch, whose precompiled header (the headers the tests share, listed in
// cmake/DtrainHelpers.cmake) every test binary reuses. It defines nothing.
